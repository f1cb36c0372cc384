"""What a server said of itself as it started (`serving.instruments.startup`), on real SGLang
0.5.23 start-up lines (tests/serving/data/sglang_startup.log, from a sglang-cpu-tiny server on
this CPU), and the look that tells a model the first time it uses a server."""

from __future__ import annotations

from pathlib import Path

from infra_agent.serving.instruments.startup import startup_facts
from infra_agent.tools.looks import Look

LOG = (Path(__file__).parent / "data" / "sglang_startup.log").read_text()


def test_the_parts_the_server_chose_are_read_from_its_start_up_log() -> None:
    assert startup_facts(LOG) == [
        "attention backend torch_native (the fallback)",
        "KV cache bfloat16, 32768 tokens",
        "max_running_requests=2048, context_len=8192",
        "chunked_prefill_size=4096, max_prefill_tokens=16384",
        "prefix cache class UnifiedRadixCache (default choice)",
        "its tree core RustUnifiedTreeCore",
    ]
    assert startup_facts("no such lines\n") == []


def test_a_look_tells_them_once_per_server() -> None:
    """Relay attempts on sglang-garbled-under-load patched RadixCache to turn prefix reuse off
    while the server ran UnifiedRadixCache: the first look at a server names its classes."""
    first = Look(patch_id=None, patch="baseline", knobs={}, number=1, limit=16, reused=False,
                 start_s=40.0, started_as=startup_facts(LOG))  # fmt: skip
    text = first.render()
    assert text.startswith(
        "the server as it started: attention backend torch_native (the fallback); "
    )
    assert text.splitlines()[-1].startswith("look 1/16 at baseline")  # the look's own line last
    assert "prefix cache class UnifiedRadixCache" in text
    again = first.model_copy(update={"number": 2, "reused": True, "started_as": []})
    assert "as it started" not in again.render()

"""What a server reported of itself as it started: the parts it chose at run time.

The deployment says what was asked (launch arguments); the start-up log says what SGLang 0.5.23
made of it, e.g. `The current platform does not support Intel AMX, will fallback to
torch_native backend.`, `KV Cache is allocated. dtype: torch.bfloat16, #tokens: 32768, ...`,
`max_total_num_tokens=32768, chunked_prefill_size=4096, ..., max_running_requests=2048, ...` and
`Tree cache initialized: source=default impl=UnifiedRadixCache ...`. Three relay attempts on
sglang-garbled-under-load patched `RadixCache` to turn prefix reuse off while the server ran
`UnifiedRadixCache`, and read the unchanged result as "not the prefix cache".
"""

from __future__ import annotations

import re

FACTS = (
    (re.compile(r"will fallback to (\w+) backend"), "attention backend {0} (the fallback)"),
    (re.compile(r"KV Cache is allocated\. dtype: torch\.(\w+), #tokens: (\d+)"), "KV cache {0}, {1} tokens"),
    (re.compile(r"(max_running_requests=\d+), (context_len=\d+)"), "{0}, {1}"),
    (re.compile(r"(chunked_prefill_size=-?\d+), (max_prefill_tokens=\d+)"), "{0}, {1}"),
    (re.compile(r"Tree cache initialized: source=(\w+) impl=(\w+)"), "prefix cache class {1} ({0} choice)"),
    (re.compile(r"Tree Core: (\w+)"), "its tree core {0}"),
)  # fmt: skip
"""(pattern, words) for each start-up fact, in the order they are told."""


def startup_facts(log: str) -> list[str]:
    """The facts the start-up log states, each once (its first statement), in `FACTS` order."""
    found = []
    for pattern, words in FACTS:
        m = pattern.search(log)
        if m is not None:
            found.append(words.format(*m.groups()))
    return found

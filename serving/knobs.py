"""The knob catalogue: SGLang server arguments worth tuning, typed, with domains and GPU needs.

Knob names are the server flags without leading dashes (`chunked-prefill-size`), so a knob
patch (`knobs.toml`) reads like the command line. `catalogue()` lists them; `task_knobs(names)`
gives the `tasks.manifest.Knob` entries a serving task declares. Before any server starts,
`check_flags(knobs, version)` refuses flags the installed SGLang's `launch_server --help` does
not list, and `check_device(knobs, catalogue, gpu=...)` refuses GPU-only knobs on a CPU.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

from infra_agent.errors import UserError
from infra_agent.serving.env import SGLANG_VERSION, ensure_sglang_env, env_python, home
from infra_agent.tasks.manifest import Knob


def _k(kind: str, default: Any, help: str, **kw: Any) -> Knob:
    return Knob(type=kind, default=default, help=help, **kw)  # type: ignore[arg-type]


CATALOGUE: dict[str, Knob] = {
    "chunked-prefill-size": _k(
        "int",
        4096,
        "Max tokens of one prefill chunk; smaller interleaves prefill with decode.",
        min=32,
        max=32768,
        log=True,
    ),
    "max-running-requests": _k(
        "int", 256, "Max requests decoded together (batch size cap).", min=1, max=4096, log=True
    ),
    "max-prefill-tokens": _k(
        "int", 16384, "Max tokens in one prefill batch.", min=256, max=65536, log=True
    ),
    "schedule-policy": _k(
        "choice",
        "fcfs",
        "Order of waiting requests: longest-prefix-match, first-come, ...",
        choices=["lpm", "random", "fcfs", "dfs-weight", "lof"],
    ),
    "schedule-conservativeness": _k(
        "float",
        1.0,
        "Higher reserves more KV memory for running requests (fewer retractions).",
        min=0.1,
        max=3.0,
    ),
    "disable-radix-cache": _k("bool", False, "Turn off prefix (radix) cache reuse."),
    "num-continuous-decode-steps": _k(
        "int", 1, "Decode steps run before the scheduler looks at new requests.", min=1, max=16
    ),
    "stream-interval": _k("int", 1, "Tokens between streamed chunks.", min=1, max=64, log=True),
    "mem-fraction-static": _k(
        "float",
        0.8,
        "Share of GPU memory for weights and KV cache.",
        min=0.3,
        max=0.95,
        needs_gpu=True,
    ),
    "cuda-graph-max-bs": _k(
        "int",
        160,
        "Largest batch captured in CUDA graphs.",
        min=1,
        max=1024,
        log=True,
        needs_gpu=True,
    ),
    "attention-backend": _k(
        "choice",
        "flashinfer",
        "Attention kernels.",
        choices=["flashinfer", "triton", "fa3", "torch_native"],
        needs_gpu=True,
    ),
    "enable-hierarchical-cache": _k(
        "bool", False, "Tiered KV cache (HiCache): host memory behind GPU.", needs_gpu=True
    ),
    "hicache-ratio": _k(
        "float",
        2.0,
        "Host KV pool size relative to the GPU pool.",
        min=1.0,
        max=8.0,
        needs_gpu=True,
    ),
    "disable-overlap-schedule": _k(
        "bool", False, "Run scheduling and GPU work one after the other.", needs_gpu=True
    ),
    "speculative-num-steps": _k(
        "int", 3, "Draft steps per verify (speculative decoding).", min=1, max=8, needs_gpu=True
    ),
    "speculative-num-draft-tokens": _k(
        "int", 4, "Draft tokens verified per step.", min=2, max=16, needs_gpu=True
    ),
}


def catalogue() -> dict[str, Knob]:
    return dict(CATALOGUE)


def task_knobs(names: list[str], **defaults: Any) -> dict[str, Knob]:
    """Catalogue entries for a task, with task-specific defaults (keyword: underscores for dashes)."""
    out = {}
    for name in names:
        if name not in CATALOGUE:
            raise UserError(f"knob '{name}' is not in the serving knob catalogue")
        knob = CATALOGUE[name].model_copy()
        key = name.replace("-", "_")
        if key in defaults:
            knob.default = knob.validate_value(name, defaults[key])
        out[name] = knob
    return out


def parse_help(text: str) -> dict[str, list[str] | None]:
    """{flag without dashes: its choices or None} from argparse `--help` output."""
    flags: dict[str, list[str] | None] = {}
    for name, choices in re.findall(r"(?<![\w-])--([a-z0-9][a-z0-9-]*)(?: \{([^}]*)\})?", text):
        if choices:
            flags[name] = choices.split(",")
        else:
            flags.setdefault(name, None)
    return flags


def help_flags(version: str = SGLANG_VERSION) -> dict[str, list[str] | None]:
    """Flags (without dashes) that `sglang.launch_server --help` lists, with their choices;
    cached per version in the infra-agent home (reading --help imports SGLang: a minute)."""
    cache = home() / f"sglang-{version}-flags.json"
    if cache.is_file():
        return dict(json.loads(cache.read_text()))
    python = env_python(ensure_sglang_env(version))
    proc = subprocess.run(
        [str(python), "-m", "sglang.launch_server", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    flags = parse_help(proc.stdout)
    if proc.returncode != 0 or len(flags) < 20:
        raise UserError(f"could not read SGLang {version}'s flags: {proc.stderr.strip()[-300:]}")
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(flags, sort_keys=True))
    return flags


def check_flags(
    knobs: dict[str, Any],
    version: str = SGLANG_VERSION,
    flags: dict[str, list[str] | None] | None = None,
) -> None:
    """UserError naming every knob the installed SGLang has no flag for, or whose value is not
    one of the flag's choices."""
    flags = flags if flags is not None else help_flags(version)
    unknown = sorted(k for k in knobs if k.replace("_", "-") not in flags)
    if unknown:
        raise UserError(f"SGLang {version} has no server argument --{', --'.join(unknown)}")
    for name, value in knobs.items():
        choices = flags[name.replace("_", "-")]
        if choices is not None and not isinstance(value, bool) and str(value) not in choices:
            raise UserError(
                f"SGLang {version}: --{name} {value} is not one of {', '.join(choices)}"
            )


def check_device(knobs: dict[str, Any], known: dict[str, Knob], *, gpu: bool) -> None:
    """UserError for a GPU-only knob set away from its default on a machine without a GPU."""
    if gpu:
        return
    gpu_only = sorted(
        k for k, v in knobs.items() if k in known and known[k].needs_gpu and v != known[k].default
    )
    if gpu_only:
        raise UserError(f"knob {', '.join(gpu_only)} needs a GPU and this machine has none")

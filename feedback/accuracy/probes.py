"""Capture named intermediate tensors from one execution path, in execution order.

Plain functions call `probe("layer3.state", t)` (a no-op returning `t` when nothing captures);
`torch.nn.Module`s are captured with forward hooks on every named submodule. Tensor dumps
written by another process (another GPU, another rank) are a directory of `torch.save` files:

    with capture() as tensors:                 # or capture(model) for forward hooks
        run_my_path(x)
    tensors  # {"embed": Tensor, "layer0.attn": Tensor, ...} in the order they were produced
    save_dump(tensors, "dumps/tp8")             # <name>.pt per tensor + order.json
    load_dump("dumps/tp8")                      # the same ordered dict back

A name probed twice (a loop) becomes `name`, `name#1`, `name#2`, ...
Captured tensors are detached copies moved to CPU unless `to_cpu=False`.
"""

from __future__ import annotations

import contextvars
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from infra_agent.errors import UserError

_active: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar(
    "infra_agent_accuracy_capture", default=None
)


class _Capture:
    def __init__(self, to_cpu: bool) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.to_cpu = to_cpu

    def add(self, name: str, value: Any) -> None:
        tensor = _first_tensor(value)
        if tensor is None:
            return
        key, i = name, 0
        while key in self.tensors:
            i += 1
            key = f"{name}#{i}"
        t = tensor.detach()
        self.tensors[key] = t.to("cpu", copy=True) if self.to_cpu else t.clone()


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, list | tuple):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    if isinstance(value, dict):
        for v in value.values():
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def probe(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Record `tensor` under `name` if a `capture()` is active; always returns `tensor`."""
    cap = _active.get()
    if cap is not None:
        cap.add(name, tensor)
    return tensor


@contextmanager
def capture(
    module: torch.nn.Module | None = None, *, to_cpu: bool = True, include: str | None = None
) -> Iterator[dict[str, torch.Tensor]]:
    """Collect `probe()` calls (and, given a module, the outputs of its named submodules whose
    names match the regular expression `include`) into the yielded ordered dict."""
    cap = _Capture(to_cpu)
    token = _active.set(cap)
    handles = []
    if module is not None:
        pattern = re.compile(include) if include else None
        for name, sub in module.named_modules():
            if not name or (pattern is not None and not pattern.search(name)):
                continue
            handles.append(sub.register_forward_hook(lambda _m, _i, out, _n=name: cap.add(_n, out)))
    try:
        yield cap.tensors
    finally:
        for h in handles:
            h.remove()
        _active.reset(token)


def _safe_file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.#-]", "_", name)


def save_dump(tensors: dict[str, torch.Tensor], directory: str | Path) -> Path:
    """Write each tensor to `<directory>/<name>.pt` and the order to `order.json`."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, t in tensors.items():
        file = _safe_file_name(name) + ".pt"
        torch.save(t.detach().cpu(), root / file)
        files[name] = file
    (root / "order.json").write_text(json.dumps({"order": list(files), "files": files}, indent=1))
    return root


def load_dump(directory: str | Path) -> dict[str, torch.Tensor]:
    """Read a dump directory: `order.json` when present, else every `*.pt` by name order.

    A file holding a dict of tensors contributes `file_stem.key` entries.
    """
    root = Path(directory)
    if not root.is_dir():
        raise UserError(f"tensor dump directory not found: {root}")
    index = root / "order.json"
    if index.is_file():
        try:
            meta = json.loads(index.read_text())
            pairs = [(name, root / meta["files"][name]) for name in meta["order"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{index} is not a valid dump index: {exc}") from exc
    else:
        pairs = [(p.stem, p) for p in sorted(root.glob("*.pt"), key=_natural_key)]
    if not pairs:
        raise UserError(f"no tensors (*.pt) in {root}")
    out: dict[str, torch.Tensor] = {}
    for name, path in pairs:
        try:
            value = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise UserError(f"cannot load tensor file {path}: {exc}") from exc
        if isinstance(value, torch.Tensor):
            out[name] = value
        elif isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, torch.Tensor):
                    out[f"{name}.{k}"] = v
        else:
            raise UserError(f"{path} holds {type(value).__name__}, not a tensor")
    return out


def _natural_key(path: Path) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path.stem)]

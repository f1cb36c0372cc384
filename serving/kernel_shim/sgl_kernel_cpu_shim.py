"""CPU compatibility for `sgl_kernel` (infra-agent's own code, used only when no GPU is present).

PyPI's `sglang-kernel` wheel is CUDA-only: `import sgl_kernel` loads a compiled library that
needs libcuda.so.1, and no CPU build is published. SGLang's CPU engine needs only the package's
pure-Python parts plus one CPU op, `copy_all_layer_kv_cache_cpu` (memory-pool warm-up and
speculative decoding). The `sgl_kernel` package next to this module is put first on the server's
PYTHONPATH; it calls `install()`, which runs the real `sgl_kernel/__init__.py` with the
compiled-library loader disabled, after registering the CPU op implemented here in PyTorch.
(Other sgl_kernel CPU ops are used only on CPUs with Intel AMX, which SGLang detects.)
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
import sys
from typing import Any

import torch

OP_SCHEMA = "copy_all_layer_kv_cache_cpu(Tensor data_ptrs, Tensor strides, Tensor tgt_loc, Tensor src_loc) -> ()"
_LIBRARY: Any = None
"""The torch.library fragment holding the op (kept alive for the process)."""


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For each K/V buffer b: rows src_loc -> rows tgt_loc, rows of strides[b] bytes at the base
    address data_ptrs[b] (uint64). All source rows are read before any is written, so tgt and
    src may overlap (the semantics of SGLang's kernel)."""
    if tgt_loc.numel() != src_loc.numel():
        raise ValueError("tgt_loc and src_loc differ in length")
    if data_ptrs.numel() != strides.numel():
        raise ValueError("data_ptrs and strides differ in length")
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.to(torch.long)
    src = src_loc.to(torch.long)
    rows = int(max(int(tgt.max()), int(src.max()))) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        raw = (ctypes.c_uint8 * (rows * int(stride))).from_address(int(ptr))
        buf = torch.frombuffer(raw, dtype=torch.uint8).view(rows, int(stride))
        buf[tgt] = buf[src]  # the right side is gathered into a new tensor first


def register_op() -> None:
    """Register `torch.ops.sgl_kernel.copy_all_layer_kv_cache_cpu` (CPU) once per process."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    lib.define(OP_SCHEMA)
    lib.impl("copy_all_layer_kv_cache_cpu", copy_all_layer_kv_cache_cpu, "CPU")
    _LIBRARY = lib


def real_package_dir(shim_root: str) -> str:
    """The installed sgl_kernel package (the first on sys.path that is not this shim)."""
    shim_root = os.path.realpath(shim_root)
    path = [p for p in sys.path if os.path.realpath(p or ".") != shim_root]
    spec = importlib.machinery.PathFinder.find_spec("sgl_kernel", path)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sgl_kernel CPU shim: the real sgl_kernel package is not installed")
    return list(spec.submodule_search_locations)[0]


def install(namespace: dict[str, Any]) -> None:
    """Turn the shim package (its globals: `namespace`) into the real sgl_kernel, minus the
    compiled library."""
    shim_pkg = os.path.dirname(os.path.abspath(namespace["__file__"]))
    real = real_package_dir(os.path.dirname(shim_pkg))
    namespace["__path__"][:] = [real]  # submodules now import from the real package
    register_op()
    from sgl_kernel import load_utils  # the real module, through the new __path__

    load_utils._load_architecture_specific_ops = lambda: None
    load_utils._preload_cuda_library = lambda: None
    init = os.path.join(real, "__init__.py")
    with open(init, encoding="utf-8") as f:
        code = compile(f.read(), init, "exec")
    namespace["__infra_agent_cpu_shim__"] = True
    exec(code, namespace)

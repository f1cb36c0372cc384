"""The sgl_kernel CPU shim's op: per-buffer row copies through raw addresses, overlap-safe."""

import importlib.util
from pathlib import Path

import pytest
import torch

from infra_agent.serving.launch import SHIM_DIR


def load_shim():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "shim_under_test", SHIM_DIR / "sgl_kernel_cpu_shim.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_copy_rows_in_every_buffer() -> None:
    shim = load_shim()
    k = torch.arange(40, dtype=torch.float32).view(10, 4)
    v = torch.arange(100, 160, dtype=torch.bfloat16).view(10, 6)
    want_k, want_v = k.clone(), v.clone()
    tgt, src = torch.tensor([7, 8, 9]), torch.tensor([1, 2, 3])
    want_k[tgt] = want_k[src].clone()
    want_v[tgt] = want_v[src].clone()
    ptrs = torch.tensor([k.data_ptr(), v.data_ptr()], dtype=torch.uint64)
    strides = torch.tensor([k.stride(0) * 4, v.stride(0) * 2], dtype=torch.long)
    shim.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt.to(torch.int32), src.to(torch.int32))
    assert torch.equal(k, want_k) and torch.equal(v, want_v)


def test_overlapping_rows_read_before_write() -> None:
    shim = load_shim()
    buf = torch.arange(12, dtype=torch.int64).view(6, 2)
    ptrs = torch.tensor([buf.data_ptr()], dtype=torch.uint64)
    strides = torch.tensor([16], dtype=torch.long)
    # Shift rows 0..3 to 1..4: a naive in-order copy would smear row 0 everywhere.
    shim.copy_all_layer_kv_cache_cpu(
        ptrs, strides, torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 2, 3])
    )
    assert buf[:, 0].tolist() == [0, 0, 2, 4, 6, 10]


def test_mismatched_lengths_are_refused() -> None:
    shim = load_shim()
    with pytest.raises(ValueError):
        shim.copy_all_layer_kv_cache_cpu(
            torch.tensor([0], dtype=torch.uint64),
            torch.tensor([8]),
            torch.tensor([1]),
            torch.tensor([1, 2]),
        )


def test_shim_package_is_not_an_infra_agent_package() -> None:
    # The shim must only ever be imported as a top-level `sgl_kernel` by a server process.
    assert not (Path(SHIM_DIR) / "__init__.py").exists()

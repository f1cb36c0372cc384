"""The capture hook and its records without a server: which calls are kept, what a kept call
holds (arguments cloned before the call, tensors over the size limits as shape and dtype only),
the counter, and the one-line refusals of a function the module does not define."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch

from infra_agent.errors import UserError
from infra_agent.serving.instruments import capture_hook
from infra_agent.serving.instruments.capture import Target, check_defined, read_capture, signature


def _module(source: str) -> dict[str, object]:
    """A module `captured_mod` (importable: a kept object's class is pickled by name)."""
    module = types.ModuleType("captured_mod")
    sys.modules["captured_mod"] = module
    exec(compile(source, "<captured_mod>", "exec"), module.__dict__)
    return module.__dict__


SOURCE = """
import threading
import torch

def scale(x, factor=2.0):
    x.mul_(factor)          # in place: the capture must hold the value before the call
    return x

class Norm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((4,), 3.0))

        self.group = threading.Lock()   # like a process group: does not pickle
        self._impl = self.impl           # a method bound to the module (CustomOp's dispatch)

    def impl(self, x):
        return x * self.weight[0]

    def forward(self, x, residual=None):
        return self._impl(x)
"""


def test_kept_calls_are_the_first_half_and_a_spread_over_all_calls_with_exact_counts(
    tmp_path: Path,
) -> None:
    ns = _module(SOURCE)
    capture_hook.install(ns, "scale", str(tmp_path), 8, 2**20, 2**20)
    scale = ns["scale"]
    assert callable(scale)
    scale(torch.ones(2))  # before arming: neither counted nor kept
    (tmp_path / capture_hook.ARMED).touch()
    for i in range(1000):
        scale(torch.full((2,), float(i)))
    seen, calls, errors = read_capture(tmp_path)
    assert seen == 1000 and not errors
    indexes = [c.index for c in calls]
    assert indexes[:4] == [0, 1, 2, 3]
    assert len(calls) <= 8 and indexes[-1] >= 500, indexes  # the spread reaches the late calls
    for call in calls:  # each kept call holds its argument as it was passed (before mul_)
        saved = torch.load(tmp_path / call.file, weights_only=False)
        assert saved["args"][0].tolist() == [float(call.index)] * 2
        assert call.args == [{"tensor": [2], "dtype": "float32"}]
        assert call.result == {"tensor": [2], "dtype": "float32"}
    assert len(list(tmp_path.glob("call-*.pt"))) == len(calls)  # dropped calls' files removed


def test_a_method_keeps_a_picklable_copy_of_its_module_and_big_tensors_as_shape_and_dtype(
    tmp_path: Path,
) -> None:
    ns = _module(SOURCE)
    capture_hook.install(ns, "Norm.forward", str(tmp_path), 4, 64, 100)
    (tmp_path / capture_hook.ARMED).touch()
    norm = ns["Norm"]()  # type: ignore[operator]
    small, large = torch.ones(4), torch.ones(64)  # 16 bytes, 256 bytes (over 64)
    out = norm(small, residual=large)
    assert out.tolist() == [3.0] * 4  # the wrapped method still computes
    norm(torch.ones(12), residual=torch.ones(16))  # 48 bytes kept, 64 more would pass 100
    _, calls, _ = read_capture(tmp_path)
    first, second = calls
    assert first.args[0] == {"object": "captured_mod.Norm"}
    assert first.stored_only == 1 and second.stored_only == 1
    assert signature(first) == "arg0: Norm, arg1: float32[4], residual: float32[64]"
    saved = torch.load(tmp_path / first.file, weights_only=False)
    module = saved["args"][0]
    assert module.weight.tolist() == [3.0] * 4  # the object's state travels
    assert isinstance(module.group, capture_hook.Unpicklable)  # what cannot travel is named
    assert repr(module.group) == "<not captured: _thread.lock>"
    assert module(torch.ones(4)).tolist() == [3.0] * 4  # its bound method is bound to the copy
    assert isinstance(saved["kwargs"]["residual"], capture_hook.Stored)
    assert saved["kwargs"]["residual"].shape == [64]
    saved = torch.load(tmp_path / second.file, weights_only=False)
    assert saved["args"][1].shape == (12,)
    assert isinstance(saved["kwargs"]["residual"], capture_hook.Stored)


def test_an_argument_that_cannot_be_saved_is_an_error_line_and_the_call_still_runs(
    tmp_path: Path,
) -> None:
    ns = _module("def f(x):\n    return x() + 1 if callable(x) else x + 1\n")
    capture_hook.install(ns, "f", str(tmp_path), 4, 2**20, 2**20)
    (tmp_path / capture_hook.ARMED).touch()
    f = ns["f"]
    assert callable(f)
    assert f(lambda: 1) == 2  # a lambda cannot be pickled: not kept, still called
    assert f(1) == 2
    seen, calls, errors = read_capture(tmp_path)
    assert seen == 2
    assert [c.index for c in calls] == [1]
    assert len(errors) == 1 and "lambda" in errors[0], errors
    assert not list(tmp_path.glob("call-*-0.*"))  # no partial files of the failed call
    meta = json.loads((tmp_path / calls[0].file.replace(".pt", ".json")).read_text())
    assert meta["args"] == [1]


def test_names_and_functions_the_module_does_not_define_are_refused_in_one_line() -> None:
    with pytest.raises(UserError, match="must read 'sglang.module.path:function'"):
        Target.parse("sglang.srt.layers.layernorm.RMSNorm.forward")
    source = "class RMSNorm:\n    def forward(self, x): ...\n\ndef helper(): ...\n"
    target = Target.parse("sglang.x:RMSNorm.forward")
    check_defined(source, target)
    with pytest.raises(UserError, match=r"defines no class Norm; its classes: RMSNorm$"):
        check_defined(source, Target.parse("sglang.x:Norm.forward"))
    with pytest.raises(UserError, match=r"RMSNorm has no method fwd; its methods: forward$"):
        check_defined(source, Target.parse("sglang.x:RMSNorm.fwd"))
    with pytest.raises(UserError, match=r"defines no function nope; its functions: helper$"):
        check_defined(source, Target.parse("sglang.x:nope"))
    inherited = "class Base: ...\nclass RMSNorm(Base):\n    pass\n"
    check_defined(inherited, Target.parse("sglang.x:RMSNorm.forward"))  # may be inherited


def test_a_method_of_an_engine_object_that_holds_modules_is_captured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay run captured TorchNativeAttnBackend._run_sdpa_forward_decode: its `self` holds the
    model runner, torch.save refused ('cannot pickle module object') and 126 calls were counted,
    none kept. An SGLang object is copied attribute by attribute, what cannot travel named."""
    module = types.ModuleType("sglang.fake_backend")
    if "sglang" not in sys.modules:  # this environment has no SGLang: a package to import from
        monkeypatch.setitem(sys.modules, "sglang", types.ModuleType("sglang"))
    monkeypatch.setitem(sys.modules, "sglang.fake_backend", module)
    source = (
        "import types\n"
        "class Backend:\n"
        "    def __init__(self):\n"
        "        self.scale = 0.5\n"
        "        self.runner = types.SimpleNamespace(module=types)  # holds a module object\n"
        "    def decode(self, x):\n"
        "        return x * self.scale\n"
    )
    exec(compile(source, "<fake_backend>", "exec"), module.__dict__)
    capture_hook.install(module.__dict__, "Backend.decode", str(tmp_path), 4, 2**20, 2**20)
    (tmp_path / capture_hook.ARMED).touch()
    backend = module.__dict__["Backend"]()  # type: ignore[operator]
    assert backend.decode(torch.ones(2)).tolist() == [0.5, 0.5]
    seen, calls, errors = read_capture(tmp_path)
    assert seen == 1 and len(calls) == 1 and not errors, errors
    saved = torch.load(tmp_path / calls[0].file, weights_only=False)
    copy = saved["args"][0]
    assert copy.scale == 0.5 and isinstance(copy.runner, capture_hook.Unpicklable)
    assert copy.decode(torch.ones(2)).tolist() == [0.5, 0.5]  # replayable on the copy

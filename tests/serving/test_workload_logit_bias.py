"""The load generator sends a logit_bias only when the load carries one (clients that ban or
favour a list of tokens), where each API takes it."""

from __future__ import annotations

from infra_agent.serving.load.generator import LoadSpec, _payload


def test_each_api_carries_the_loads_logit_bias() -> None:
    bias = {"7": -100.0, "9": 2.5}
    native = _payload(LoadSpec(logit_bias=bias), [5, 6], None, 4, seed=1)
    assert native["sampling_params"]["logit_bias"] == bias and "logit_bias" not in native
    openai = _payload(LoadSpec(api="completions", logit_bias=bias), [5, 6], None, 4, seed=1)
    assert openai["logit_bias"] == bias


def test_no_logit_bias_unless_the_load_has_one() -> None:
    for api in ("generate", "completions"):
        body = _payload(LoadSpec(api=api), [5], None, 4, seed=0)  # type: ignore[arg-type]
        assert "logit_bias" not in body and "logit_bias" not in body.get("sampling_params", {})


def test_each_api_carries_the_loads_stop_strings_and_patterns() -> None:
    stops = {"stop": ["</answer>"], "stop_regex": ["\n\n###[^#]"]}
    native = _payload(LoadSpec(**stops), [5, 6], None, 4, seed=1)
    assert {k: native["sampling_params"][k] for k in stops} == stops
    assert "stop" not in native and "stop_regex" not in native
    openai = _payload(LoadSpec(api="completions", **stops), [5, 6], None, 4, seed=1)
    assert {k: openai[k] for k in stops} == stops
    for api in ("generate", "completions"):
        body = _payload(LoadSpec(api=api), [5], None, 4, seed=0)  # type: ignore[arg-type]
        assert not {"stop", "stop_regex"} & (body.keys() | body.get("sampling_params", {}).keys())

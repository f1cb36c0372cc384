"""The load generator asks for log-probabilities only when the load says so (RL-style clients)."""

from __future__ import annotations

from infra_agent.serving.workload import LoadSpec, _payload


def test_generate_asks_for_logprobs_with_top_n_and_text() -> None:
    load = LoadSpec(return_logprob=True, top_logprobs_num=5, return_text_in_logprobs=True)
    body = _payload(load, [5, 6, 7], None, 16, seed=3)
    assert body["return_logprob"] is True
    assert body["top_logprobs_num"] == 5 and body["return_text_in_logprobs"] is True
    assert body["input_ids"] == [5, 6, 7] and body["sampling_params"]["max_new_tokens"] == 16


def test_completions_asks_for_top_n_logprobs() -> None:
    body = _payload(
        LoadSpec(api="completions", return_logprob=True, top_logprobs_num=3), [5], None, 4, 0
    )
    assert body["logprobs"] == 3 and body["max_tokens"] == 4


def test_no_logprob_fields_unless_asked() -> None:
    for api in ("generate", "completions"):
        body = _payload(LoadSpec(api=api), [5], None, 4, seed=0)  # type: ignore[arg-type]
        assert not {"return_logprob", "top_logprobs_num", "logprobs"} & set(body)

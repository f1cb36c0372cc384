"""The load generator asks for log-probabilities only when the load says so (RL-style clients)."""

from __future__ import annotations

from infra_agent.serving.load.generator import LoadSpec, RequestRecord, _absorb, _payload


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


def test_an_incremental_stream_counts_a_delta_that_repeats_the_first_token() -> None:
    """A delta [7, 8] after [7] is two new tokens on an incremental stream (the prefix rule would
    read it as the cumulative [7, 8] and lose one: seen live as 103 tokens carried for 104)."""
    record = RequestRecord(session=0, turn=0, success=False, prompt_tokens=1)
    load = LoadSpec(incremental=True)
    assert _absorb(load, record, {"text": "a", "output_ids": [7]})[0] == 1
    assert _absorb(load, record, {"text": "bc", "output_ids": [7, 8]})[0] == 2
    assert record.output_ids == [7, 7, 8]
    cumulative = RequestRecord(session=0, turn=0, success=False, prompt_tokens=1)
    _absorb(LoadSpec(), cumulative, {"text": "a", "output_ids": [7]})
    _absorb(LoadSpec(), cumulative, {"text": "ab", "output_ids": [7, 8]})
    assert cumulative.output_ids == [7, 8]

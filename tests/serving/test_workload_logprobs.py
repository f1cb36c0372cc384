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


def test_scoring_and_rollout_tasks_ask_for_logprobs_and_say_so() -> None:
    """ServingHarness.load reads the request shape from a task's params (top_logprobs_num,
    return_text_in_logprobs) and the deployment (incremental streaming); the workload says it."""
    from infra_agent.experiments.arms import load_harness
    from infra_agent.tasks.registry import find_task

    def harness(name: str):  # type: ignore[no-untyped-def]
        task = find_task(name)
        return load_harness(task, dict(task.manifest.params))

    rollout = harness("sglang-real-rl-rollout-stall")
    load = rollout.load(seed=1)
    assert load.return_logprob and load.top_logprobs_num == 5 and load.return_text_in_logprobs
    assert load.incremental  # its deployment streams increments
    assert "its top 5 alternatives and their text" in rollout.workload({}).summary
    scoring = harness("sglang-real-scored-stream-slowdown").load(seed=1)
    assert scoring.return_logprob and scoring.top_logprobs_num == 5
    assert not scoring.return_text_in_logprobs and not scoring.incremental
    plain = harness("sglang-cpu-tiny")
    assert not plain.load(seed=1).return_logprob and not plain.load(seed=1).incremental
    assert "logprob" not in plain.workload({}).summary

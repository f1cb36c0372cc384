"""Policy choice, the search policy's moves, budgets and scripts (no experiments run here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from infra_agent.agent.configuration import resolve_policy
from infra_agent.agent.policies.scripted import ScriptedPolicy, load_script
from infra_agent.agent.policies.search import SearchPolicy
from infra_agent.agent.state import AgentState, ExperimentOutcome, Message
from infra_agent.cli.options import parse_budget
from infra_agent.config import LLMSettings
from infra_agent.errors import UserError
from infra_agent.tasks.registry import find_task
from infra_agent.tools.skeletons import knob_advice, load_skeletons


def _measured(knobs: dict[str, object], verdict: str, speedup: float) -> ExperimentOutcome:
    return ExperimentOutcome(
        experiment_id=f"exp-{len(knobs)}-{speedup}", patch_id="p" + json.dumps(knobs, sort_keys=True),
        patch_summary="", knobs=knobs, verdict=verdict, speedup=speedup, ci_low=speedup - 0.1, ci_high=speedup + 0.1,
    )  # fmt: skip


def test_auto_picks_search_without_an_endpoint_and_says_why() -> None:
    name, reason = resolve_policy("auto", LLMSettings(), None)
    assert name == "search" and "no LLM endpoint is configured" in reason
    configured = LLMSettings.model_validate(
        {"endpoint": {"base_url": "http://127.0.0.1:1/v1", "model": "glm-x"}}
    )
    name, reason = resolve_policy("auto", configured, None)
    assert name == "llm" and "glm-x" in reason


def test_scripted_is_never_silent_and_llm_needs_an_endpoint(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="needs --script"):
        resolve_policy("scripted", LLMSettings(), None)
    with pytest.raises(UserError, match="only used with --policy scripted"):
        resolve_policy("auto", LLMSettings(), tmp_path / "s.json")
    with pytest.raises(UserError, match="needs an endpoint"):
        resolve_policy("llm", LLMSettings(), None)
    name, reason = resolve_policy("scripted", LLMSettings(), tmp_path / "s.json")
    assert name == "scripted" and "test equipment" in reason


def test_search_tries_skeleton_advice_first_then_tpe() -> None:
    manifest = find_task("sglang-cpu-tiny").manifest
    policy = SearchPolicy(manifest, knob_advice(load_skeletons()))
    state = AgentState(run_id="r")
    assert policy.next_configs(state) == [{"max-running-requests": 128}]
    state.experiments.append(_measured({"max-running-requests": 128}, "IMPROVED", 1.8))
    nxt = policy.next_configs(state)
    assert len(nxt) == 1 and nxt[0] != {"max-running-requests": 128} and nxt[0]
    assert all(v in policy.space[k] for k, v in nxt[0].items())
    for knobs in ({"max-running-requests": v} for v in (64, 256, 32)):
        state.experiments.append(_measured(knobs, "IMPROVED", 1.5))
    # The other knob's advice is tried on top of the best so far, not from the defaults.
    (nxt,) = policy.next_configs(state)
    assert nxt["max-running-requests"] == 128 and "chunked-prefill-size" in nxt
    turn = policy.next_turn(state, [])
    assert turn.message is not None
    assert [c.name for c in turn.message.tool_calls] == ["propose_knobs", "run_experiment"]


def test_tpe_search_is_a_function_of_the_measured_history() -> None:
    """A resumed run rebuilds the study from its experiments: same history, same next move."""
    manifest = find_task("decode-split-norm").manifest
    state = AgentState(run_id="r")
    for knobs, verdict, speedup in [({"num_splits": 2}, "IMPROVED", 2.0),
                                    ({"threads": 2}, "REJECTED", 1.0),
                                    ({"block_size": 64}, "NO_CHANGE", 1.0),
                                    ({"num_splits": 16}, "REGRESSED", 0.5)]:  # fmt: skip
        state.experiments.append(_measured(knobs, verdict, speedup))
    a = SearchPolicy(manifest, {}, batch=3, seed=5).next_configs(state)
    b = SearchPolicy(manifest, {}, batch=3, seed=5).next_configs(state)
    assert a == b and len(a) == 3
    measured = {json.dumps(e.knobs, sort_keys=True) for e in state.experiments}
    assert not measured & {json.dumps(c, sort_keys=True) for c in a}


def test_search_finishes_when_the_space_is_measured() -> None:
    manifest = find_task("decode-split-norm").manifest
    policy = SearchPolicy(manifest, {}, batch=1000)
    state = AgentState(run_id="r")
    configs = policy.next_configs(state)
    size = 1
    for values in policy.space.values():
        size *= len(values)
    assert len(configs) == size - 1  # every configuration but the defaults, once
    assert len({json.dumps(c, sort_keys=True) for c in configs}) == size - 1
    state.experiments.extend(_measured(c, "NO_CHANGE", 1.0) for c in configs)
    turn = policy.next_turn(state, [])
    assert turn.message is not None and [c.name for c in turn.message.tool_calls] == ["finish"]


def test_runs_stored_with_the_coordinate_search_resume_with_tpe() -> None:
    from infra_agent.agent.configuration import RunConfig

    config = RunConfig.model_validate({"task": "t", "search_strategy": "coordinate"})
    assert config.search_strategy == "tpe"


def test_random_search_is_seeded_and_never_repeats() -> None:
    manifest = find_task("decode-split-norm").manifest
    a = SearchPolicy(manifest, {}, strategy="random", batch=5, seed=1).next_configs(AgentState())
    b = SearchPolicy(manifest, {}, strategy="random", batch=5, seed=1).next_configs(AgentState())
    assert a == b and len(a) == 5 and len({json.dumps(c, sort_keys=True) for c in a}) == 5


def test_budget_flag() -> None:
    assert parse_budget("8") == {"experiments": 8}
    assert parse_budget("experiments=3,wall=30m,tokens=200k,turns=9,cost=2.5") == {
        "experiments": 3, "wall_s": 1800.0, "tokens": 200000, "turns": 9, "cost_usd": 2.5,
    }  # fmt: skip
    for bad in ("speed=9", "wall=fast", "turns=3m"):
        with pytest.raises(UserError, match="--budget"):
            parse_budget(bad)


def test_scripts_replay_by_turn_and_substitute_the_last_patch(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(
        json.dumps({"tool_calls": [{"name": "describe_task"}], "reasoning_content": "R1",
                    "prompt_tokens": 900, "cached_prompt_tokens": 512, "completion_tokens": 80,
                    "reasoning_tokens": 64}) + "\n"
        + json.dumps({"tool_calls": [{"name": "run_experiment", "arguments": {"patch_id": "{{last_patch_id}}"}}]}) + "\n"
    )  # fmt: skip
    policy = ScriptedPolicy(load_script(path))
    state = AgentState(run_id="r", patches=["abc"])
    turn = policy.next_turn(state, [])
    first = turn.message
    assert first is not None and first.tool_calls[0].name == "describe_task"
    assert first.reasoning_content == "R1"
    assert (turn.prompt_tokens, turn.cached_prompt_tokens) == (900, 512)
    assert (turn.completion_tokens, turn.reasoning_tokens) == (80, 64)
    state.messages.append(first)
    unreported = policy.next_turn(state, [])
    assert unreported.cached_prompt_tokens is None and unreported.reasoning_tokens is None
    second = unreported.message
    assert second is not None and json.loads(second.tool_calls[0].arguments) == {"patch_id": "abc"}
    state.messages.append(Message(role="assistant"))
    done = policy.next_turn(state, []).message
    assert done is not None and done.tool_calls[0].name == "finish"
    (tmp_path / "bad.json").write_text('[{"tool_calls": 3}]')
    with pytest.raises(UserError, match="reply 0"):
        load_script(tmp_path / "bad.json")


def test_cli_refuses_bad_input_with_one_line_and_records_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from infra_agent.cli import main

    db = tmp_path / "runs.db"
    cases = [
        (["--policy", "bogus"], "--policy: 'bogus'"),
        (["--policy", "scripted"], "needs --script"),
        (["--policy", "llm"], "needs an endpoint"),
        (["--task", "no-such-task"], "unknown task 'no-such-task'"),
        (["--task", "decode-split-norm", "--target", "accuracy"], "optimizes throughput"),
        (["--task", "decode-split-norm", "--budget", "lots"], "--budget"),
        (["--resume", "run-nope"], "no run 'run-nope'"),
    ]
    for args, message in cases:
        monkeypatch.setattr(sys, "argv", ["infra-agent", "--db", str(db), "optimize", *args])
        with pytest.raises(SystemExit) as exit_info:
            main()
        err = capsys.readouterr().err
        assert exit_info.value.code == 2, (args, err)
        assert message in err and "Traceback" not in err, (args, err)
        assert err.strip().startswith("error: ") and len(err.strip().splitlines()) == 1, (args, err)
    if db.exists():
        from infra_agent.store import open_store

        assert open_store(db).list_runs() == []


def test_the_best_candidate_is_the_one_proven_best() -> None:
    """On sglang-cpu-tiny four overlapping wins were once ranked by point estimate and the
    winner applied; the interval's low end (what is shown) decides now."""
    from infra_agent.agent.handoff import best_improved

    def outcome(i: int, speedup: float, low: float, verdict: str = "IMPROVED") -> ExperimentOutcome:
        return ExperimentOutcome(
            experiment_id=f"e{i}", patch_id=f"p{i}", patch_summary=f"knob={i}", verdict=verdict,
            speedup=speedup, ci_low=low, ci_high=2 * speedup - low,
        )  # fmt: skip

    state = AgentState(run_id="r")
    state.experiments = [
        outcome(0, 1.56, 1.18),  # noisy: the highest point estimate
        outcome(1, 1.31, 1.24),  # tight: the most proven
        outcome(2, 1.40, 1.20),
        outcome(3, 1.90, 1.60, verdict="NO_CHANGE"),
    ]
    best = best_improved(state)
    assert best is not None and best.experiment_id == "e1"

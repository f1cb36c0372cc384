"""Patched SGLang servers that cheat the serving judge, on the real server (sglang-cpu-tiny).

Each cheat is a source patch to the installed SGLang, applied the way experiments apply patches,
and written to win where its defence is missing; each must come out INCORRECT with its
mechanism named, while an A/A candidate (the baseline's code behind a no-op patch) must not:

- flat logits only for sampled requests without log-probs: the measured workload's shape, never
  the old accuracy gate's (greedy, with log-probs). Caught by the likelihood judge of the check,
  which runs the measured workload's own requests.
- a quarter of each output generated, the rest fabricated filler, counts claimed to match:
  caught by the likelihood judge.
- the final `completion_tokens` inflated 4x: caught by the client's own count.

Short experiments (24 prompts of at most 16 tokens a sample, 2 samples per arm): the assertions
need the judge, not a resolved interval. Server starts dominate the time: the baseline arm of
every experiment here is one kept server (tests/serving/conftest.py's `lent_baseline`, the
unpatched engine with the task's knobs, shared with test_sglang_server.py), so each test starts
only its candidate's server.
"""

from __future__ import annotations

import difflib

import pytest

from infra_agent.experiments import run_experiment
from infra_agent.serving.env import find_sglang_env
from infra_agent.serving.overlay import installed_package
from infra_agent.store.verdict import Verdict
from infra_agent.tasks.manifest import Task
from infra_agent.tasks.patch import Patch, parse_diff
from infra_agent.tasks.registry import find_task

pytestmark = [
    pytest.mark.timeout(2400),
    pytest.mark.slow,
    pytest.mark.sglang,
    pytest.mark.usefixtures("lent_baseline"),
    pytest.mark.skipif(
        find_sglang_env() is None,
        reason="SGLang environment not created (python -m infra_agent.serving.env --ensure)",
    ),
]
TASK = find_task("sglang-cpu-tiny")
SMALL = {"num_prompts": 24, "output_len": 16, "warmup_prompts": 4}

SAMPLER = "sglang/srt/layers/sampler.py"
TOKENIZER_MANAGER = "sglang/srt/managers/tokenizer_manager.py"

FLAT_WHEN_UNJUDGED = (
    SAMPLER,
    """            else:
                # Standard path: do softmax and sample from probs.
                logits.div_(sampling_info.temperatures)
""",
    """            elif not return_logprob:
                # "Fast path" for plain sampled requests: no softmax, no sampling.
                batch_next_token_ids = torch.randint(
                    3, logits.shape[-1], (logits.shape[0],), device=logits.device
                )
            else:
                # Standard path: do softmax and sample from probs.
                logits.div_(sampling_info.temperatures)
""",
)

QUARTER_THEN_FILLER = [
    (
        TOKENIZER_MANAGER,
        """        sampling_params = self.sampling_params_class(**sampling_kwargs)
        sampling_params.normalize(self.tokenizer)
""",
        """        want = sampling_kwargs.get("max_new_tokens")
        if isinstance(obj, GenerateReqInput) and not obj.return_logprob and want and want >= 4:
            self.__dict__.setdefault("pad_to", {})[obj.rid] = want
            sampling_kwargs["max_new_tokens"] = want // 4
        sampling_params = self.sampling_params_class(**sampling_kwargs)
        sampling_params.normalize(self.tokenizer)
""",
    ),
    (
        TOKENIZER_MANAGER,
        """                delta_output_ids = list(recv_obj.output_ids[i])
                output_offset = state.last_output_offset
                state.append_text(delta_text)
                state.output_ids.extend(delta_output_ids)
""",
        """                delta_output_ids = list(recv_obj.output_ids[i])
                output_offset = state.last_output_offset
                state.append_text(delta_text)
                state.output_ids.extend(delta_output_ids)
                pad_to = self.__dict__.get("pad_to", {})
                if state.finished and (want := pad_to.pop(state.obj.rid, None)):
                    import random

                    state.output_ids.extend(
                        random.randrange(3, 1024) for _ in range(want - len(state.output_ids))
                    )
                    meta_info["completion_tokens"] = want
""",
    ),
]

INFLATED_FINAL_COUNT = (
    TOKENIZER_MANAGER,
    """                        "completion_tokens": recv_obj.completion_tokens[i],
""",
    """                        "completion_tokens": recv_obj.completion_tokens[i]
                        * (4 if recv_obj.finished_reasons[i] is not None else 1),
""",
)

NO_OP = (
    SAMPLER,
    """                # Standard path: do softmax and sample from probs.
""",
    """                # Standard path: do softmax and sample from probs (unchanged).
""",
)


def patch_of(*edits: tuple[str, str, str]) -> Patch:
    """A diff patch of the installed SGLang: each (file, old text, new text) replaced once."""
    root = installed_package().parent
    diffs = []
    for path in sorted({path for path, _, _ in edits}):
        old = (root / path).read_text()
        new = old
        for where, before, after in edits:
            if where == path:
                assert new.count(before) == 1, f"{path}: the patched text is not found once"
                new = new.replace(before, after)
        diffs.append(
            "".join(
                difflib.unified_diff(
                    old.splitlines(keepends=True),
                    new.splitlines(keepends=True),
                    f"a/{path}",
                    f"b/{path}",
                )
            )
        )
    return parse_diff("".join(diffs))


def short(samples: int) -> Task:
    """The task with `samples` per arm in the performance stage."""
    manifest = TASK.manifest.model_copy(deep=True)
    manifest.budget = manifest.budget.model_copy(
        update={"min_samples": samples, "max_samples": samples}
    )
    return TASK.model_copy(update={"manifest": manifest})


@pytest.mark.parametrize(
    ("edits", "mechanism"),
    [
        ([FLAT_WHEN_UNJUDGED], "likelihood FAIL"),
        (QUARTER_THEN_FILLER, "likelihood FAIL"),
        ([INFLATED_FINAL_COUNT], "token count inflated"),
    ],
    ids=["flat-logits-on-unjudged-shape", "quarter-then-filler", "inflated-final-count"],
)
def test_cheating_server_is_incorrect_with_its_mechanism_named(
    edits: list[tuple[str, str, str]], mechanism: str
) -> None:
    """Over 60 s on a 2-core machine (a start of 40-90 s, minutes under load, and the check's
    run): each cheat needs a server of its own, since the cheat is the server's patched code."""
    record = run_experiment(short(2), patch_of(*edits), params=SMALL)
    result = record.result
    print(result.render())
    assert result.verdict is Verdict.INCORRECT, result.reasons
    assert any(mechanism in reason for reason in result.reasons), result.reasons


def test_a_candidate_running_the_baseline_code_passes_the_judge() -> None:
    """Over 60 s on a 2-core machine: the control for the cheats above (the judge passes a
    patched server that serves the baseline's code), so a server started from a source patch,
    and a whole experiment (check, performance and health stages)."""
    record = run_experiment(short(2), patch_of(NO_OP), params=SMALL)
    result = record.result
    print(result.render())
    assert result.verdict is not Verdict.INCORRECT, result.reasons
    assert result.evidence.correctness is not None and result.evidence.correctness.passed
    health = result.evidence.health
    assert health["candidate_likelihood_passed"] is True, health
    # Every measured output was judged: the check's run and each sample's, both arms alike.
    assert health["candidate_outputs"] == health["baseline_outputs"] == 24 * 3
    assert health["candidate_likelihood_pairs"] == 24 * 3

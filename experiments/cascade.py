"""The verification cascade: one experiment, baseline against a patch, cheapest checks first.

    apply -> static -> correctness -> performance -> health

Each stage may end the experiment with a verdict (`_Stop`); whatever happens, every sandbox and
worker is cleaned up (also on Ctrl-C, which propagates after cleanup). Seeds for inputs come from
os.urandom in this process; timing is done by the harness with its own clock. A request is checked,
run and recorded by `experiments/run.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from infra_agent.errors import describe
from infra_agent.experiments import rules
from infra_agent.experiments.arms import (
    ArmStartError,
    SeedSource,
    arm_set,
    load_harness,
    sandbox_spec,
)
from infra_agent.experiments.extend import Prior
from infra_agent.experiments.measure import ArmError, ExperimentTimeout, decide, evidence, measure
from infra_agent.experiments.rule_groups import normalize_allow
from infra_agent.sandboxes.procwatch import ProcessWatch
from infra_agent.store.verdict import (
    CorrectnessEvidence,
    Evidence,
    ExperimentResult,
    Flag,
    SandboxEvidence,
    Verdict,
)
from infra_agent.tasks.checked import CheckedPatch, checked
from infra_agent.tasks.harness import (
    Arm,
    BaselineFailure,
    CandidateFailure,
    CheckResult,
    Harness,
    IncorrectOutput,
)
from infra_agent.tasks.manifest import Task
from infra_agent.tasks.patch import (
    NotEditableError,
    Patch,
    apply_patch,
    effective_knobs,
)
from infra_agent.tasks.tree import workspace_folder

Progress = Callable[[str], None]
WARMUP_SEEDS = 2


class _Stop(Exception):
    """Ends the cascade with a verdict."""

    def __init__(self, verdict: Verdict, *reasons: str, flags: tuple[Flag, ...] = ()) -> None:
        super().__init__(verdict.value)
        self.verdict = verdict
        self.reasons = list(reasons)
        self.flags = list(flags)


def _failure(arm: str, error: BaseException) -> _Stop:
    """The verdict for an exception raised while running `arm`."""
    if arm == "baseline" or isinstance(error, BaselineFailure):
        return _Stop(
            Verdict.FAILED,
            f"baseline failed, so nothing can be compared (task or sandbox problem): {describe(error)}",
            flags=(Flag.BASELINE_FAILED,),
        )
    if isinstance(error, IncorrectOutput):
        return _Stop(Verdict.INCORRECT, f"candidate output is wrong: {error}")
    if isinstance(error, CandidateFailure):
        if error.kind == "violation":
            return _Stop(Verdict.REJECTED, f"run-time rule broken: {error}")
        what = {
            "timeout": "timed out",
            "memory": "ran out of memory",
            "protocol": "broke the worker protocol",
        }
        return _Stop(Verdict.FAILED, f"candidate {what.get(error.kind, 'crashed')}: {error}")
    return _Stop(
        Verdict.FAILED,
        f"harness error while running the candidate: {describe(error, typed=True)}",
    )


class Experiment:
    """State of one run of the cascade."""

    def __init__(
        self, task: Task, patch: Patch | CheckedPatch, *, backend: str, params: dict[str, Any],
        progress: Progress | None, bootstrap_seed: int, detect: float | None = None,
        prior: Prior | None = None,
    ) -> None:  # fmt: skip
        self.checked = checked(patch, task)
        self.task, self.patch, self.backend = task, self.checked.patch, backend
        self.manifest = task.manifest
        self.params = params
        self.progress = progress or (lambda _msg: None)
        self.bootstrap_seed = bootstrap_seed
        self.detect = detect
        self.prior = prior
        self.evidence = Evidence(params=params)
        self.flags: list[Flag] = []
        self.reasons: list[str] = []
        self.seeds = SeedSource()
        self.arms = arm_set(task)
        self.deadline = time.monotonic() + self.manifest.budget.experiment_timeout_s
        self.log_tail = ""

    # -- stages ----------------------------------------------------------------------------

    def static(self) -> None:
        """Read the code the patch adds, as its check applied it (`tasks.checked`)."""
        if self.patch.kind != "diff":
            return
        if self.checked.refusal is not None:  # not editable: REJECTED by `run`
            raise self.checked.refusal
        before = {f.path: _text(f.before, newlines=False) for f in self.checked.files}
        after = {f.path: _text(f.after, newlines=True) for f in self.checked.files}
        found = rules.new_violations(before, after, self.manifest.allow)
        if found:
            self.evidence.rule_violations = [v.describe() for v in found]
            raise _Stop(Verdict.REJECTED, *(f"static {v.describe()}" for v in found[:5]))

    def open_arms(self, create: Callable[..., Any]) -> tuple[Arm, Arm]:
        spec = sandbox_spec(self.task)
        # Both arms hold the same files (a package workspace: the injected ones and the patch's).
        with workspace_folder(self.task, self.patch.files) as folder:
            base_sb = create(self.backend, folder, spec)
            base = self.arms.open(
                "baseline", base_sb, effective_knobs(None, self.manifest), self.params
            )
            cand_sb = create(self.backend, folder, spec)
        knobs = apply_patch(self.patch, self.task, cand_sb.root)
        cand = self.arms.open("candidate", cand_sb, knobs, self.params)
        in_force, missing = cand_sb.isolation()
        self.evidence.sandbox = SandboxEvidence(
            backend=self.backend, isolation=in_force, missing=missing
        )
        return base, cand

    def prepare(self, harness: Harness, arms: tuple[Arm, Arm]) -> None:
        harness.warmup_seeds = [self.seeds.fresh() for _ in range(WARMUP_SEEDS)]
        if self.manifest.kind == "python":
            try:
                self.arms.start_workers(list(arms))
            except ArmStartError as exc:
                raise _failure(exc.arm, exc.error) from exc
        try:
            for arm in arms:
                try:
                    harness.prepare(arm)
                except Exception as exc:
                    raise _failure(arm.name, exc) from exc
        finally:
            self._code_confinement(harness, arms[1])
        if self.manifest.kind == "python" and self.evidence.sandbox is not None:
            methods = sorted({w.watch.method for w in self.arms.workers})
            self.evidence.sandbox.isolation.append(f"proc-watch:{'+'.join(methods)}")

    def _code_confinement(self, harness: Harness, cand: Arm) -> None:
        """Where the harness runs the candidate's code outside its sandbox (a serving task's
        patched server), the sandbox evidence states what confined that code instead."""
        described = getattr(harness, "code_confinement", None)
        found = described(cand) if callable(described) else None
        if found is not None and self.evidence.sandbox is not None:
            self.evidence.sandbox.isolation, self.evidence.sandbox.missing = found

    def correctness(self, harness: Harness, base: Arm, cand: Arm) -> None:
        checks = max(1, self.manifest.budget.correctness_checks)
        results: dict[str, list[CheckResult]] = {"baseline": [], "candidate": []}
        for _ in range(checks):
            seed = self.seeds.fresh()
            for arm in (base, cand):
                self._check_deadline()
                try:
                    result = harness.check(arm, seed)
                except Exception as exc:
                    raise _failure(arm.name, exc) from exc
                results[arm.name].append(result)
                self._invariants(arm, result)
                if not result.passed:
                    self.evidence.correctness = _correctness(
                        results, passed=False, detail=result.detail
                    )
                    if arm is base:
                        raise _Stop(
                            Verdict.FAILED,
                            f"baseline fails its own correctness check (task problem): {result.detail}",
                        )
                    raise _Stop(
                        Verdict.INCORRECT,
                        f"candidate output does not match the reference: {result.detail}",
                    )
        corr = _correctness(results, passed=True)
        self.evidence.correctness = corr
        tol = self.manifest.tolerance
        if corr.baseline_err_f64 is not None and corr.candidate_err_f64 is not None:
            limit = max(corr.baseline_err_f64 * tol.f64_factor, tol.f64_floor)
            if corr.candidate_err_f64 > limit:
                corr.passed = False
                corr.detail = (
                    f"error vs float64 {corr.candidate_err_f64:.3g} exceeds the allowed "
                    f"{limit:.3g} (baseline {corr.baseline_err_f64:.3g} x {tol.f64_factor:g}, floor {tol.f64_floor:g})"
                )
                raise _Stop(
                    Verdict.INCORRECT, f"candidate is less accurate than baseline: {corr.detail}"
                )
            if limit > 0 and corr.candidate_err_f64 > 0.8 * limit:
                self.flags.append(Flag.ACCURACY_NEAR_THRESHOLD)
                self.reasons.append(
                    # the error itself is on the correctness line of the verdict
                    f"accuracy near the threshold: error vs float64 above 80% of the allowed {limit:.3g}"
                )

    def _invariants(self, arm: Arm, result: CheckResult) -> None:
        """Every declared invariant must be reported on every pass; the candidate must hold
        each. What each arm showed is kept in the evidence ('invariants')."""
        declared = self.manifest.invariants
        if not declared:
            return
        seen = self.evidence.extra.setdefault("invariants", {})
        assert isinstance(seen, dict)
        for name, what in declared.items():
            if name not in result.invariants:
                raise _Stop(
                    Verdict.FAILED,
                    f"the harness did not check the task's invariant '{name}' (task problem)",
                )
            broken = result.invariants[name]
            entry = seen.setdefault(name, {"baseline": "held", "candidate": "held"})
            if broken is not None:
                entry[arm.name] = f"broken: {broken}"
                if arm.name == "candidate":
                    raise _Stop(Verdict.INCORRECT, f"invariant '{name}' ({what}) broken: {broken}")

    def performance(self, harness: Harness, base: Arm, cand: Arm) -> Verdict:
        try:
            m = measure(
                harness, base, cand, self.manifest, self.seeds, deadline=self.deadline,
                bootstrap_seed=self.bootstrap_seed, progress=self.progress, detect=self.detect,
                prior=self.prior,
            )  # fmt: skip
        except ArmError as exc:
            raise _failure(exc.arm, exc.error) from exc
        self.evidence.performance = evidence(m, self.manifest)
        verdict, reasons, flags, metrics = decide(m, self.manifest)
        self.evidence.metrics.update(metrics)
        self.flags.extend(flags)
        self.reasons[:0] = reasons
        return verdict

    def health(self, harness: Harness, base: Arm, cand: Arm) -> None:
        seed = self.seeds.fresh()
        values = {}
        for arm in (base, cand):
            try:
                values[arm.name] = harness.health(arm, seed)
            except Exception as exc:
                raise _failure(arm.name, exc) from exc
        self.evidence.health = {
            f"{arm}_{k}": v for arm, found in values.items() for k, v in found.items()
        }
        problems = harness.health_problems(values["baseline"], values["candidate"])
        if problems:
            self.flags.append(Flag.HEALTH_WARNING)
            raise _Stop(Verdict.INCORRECT, *(f"health check: {p}" for p in problems))

    # -- driver ----------------------------------------------------------------------------

    def _check_deadline(self) -> None:
        if time.monotonic() > self.deadline:
            raise ExperimentTimeout()

    def _stage(self, name: str, run: Callable[[], Any]) -> Any:
        self.progress(name)
        self.evidence.stage_reached = name
        started = time.monotonic()
        try:
            return run()
        finally:
            self.evidence.durations_s[name] = round(time.monotonic() - started, 4)

    def run(self, create: Callable[..., Any]) -> ExperimentResult:
        harness: Harness | None = None
        arms: tuple[Arm, Arm] | None = None
        verdict = Verdict.NO_CHANGE
        try:
            self._stage("static", self.static)
            harness = load_harness(self.task, self.params)
            arms = self._stage("sandbox", lambda: self.open_arms(create))
            base, cand = arms
            self._stage("prepare", lambda: self.prepare(harness, arms))
            self._stage("correctness", lambda: self.correctness(harness, base, cand))
            verdict = self._stage("performance", lambda: self.performance(harness, base, cand))
            self._stage("health", lambda: self.health(harness, base, cand))
        except _Stop as stop:
            verdict = stop.verdict
            self.reasons[:0] = stop.reasons
            self.flags.extend(stop.flags)
            cause = stop.__cause__
            if isinstance(cause, ArmError):
                cause = cause.error
            if isinstance(cause, CandidateFailure):
                self.log_tail = cause.log_tail
        except NotEditableError as exc:
            verdict = Verdict.REJECTED
            self.reasons[:0] = [str(exc)]
            self.evidence.rule_violations.append(str(exc))
        except ExperimentTimeout:
            verdict = Verdict.FAILED
            limit = self.manifest.budget.experiment_timeout_s
            self.reasons[:0] = [f"experiment ran past its time limit of {limit:g} s"]
        finally:
            if harness is not None and arms is not None:
                for arm in arms:
                    try:
                        harness.finish(arm)
                    except Exception:  # noqa: BLE001 - finish must not mask the verdict
                        pass
            self.arms.close()
            if arms is not None:
                watches = {arm.name: getattr(arm._worker, "watch", None) for arm in arms}
                watched = {
                    name: watch.summary()
                    for name, watch in watches.items()
                    if isinstance(watch, ProcessWatch)
                }
                if watched:  # python tasks: what the leftover-work guard saw in each worker
                    self.evidence.extra["process_watch"] = watched
        self.evidence.log_tail = self.log_tail[-4000:]
        self.evidence.extra["fresh_input_seeds"] = len(self.seeds.used)
        self.evidence.extra["static_rules_allowed"] = sorted(normalize_allow(self.manifest.allow))
        return ExperimentResult(
            task=self.task.name,
            patch_id=self.patch.hash,
            verdict=verdict,
            reasons=self.reasons,
            flags=list(dict.fromkeys(self.flags)),
            evidence=self.evidence,
        )


def _text(content: bytes | None, *, newlines: bool) -> str | None:
    """A file's text as the static rules read it; `newlines`: with universal newlines, as a
    patched file was read from the scratch copy."""
    if content is None:
        return None
    text = content.decode(errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n") if newlines else text


def _correctness(
    results: dict[str, list[CheckResult]], *, passed: bool, detail: str | None = None
) -> CorrectnessEvidence:
    def top(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return max(present) if present else None

    cand = results["candidate"]
    return CorrectnessEvidence(
        passed=passed,
        checks=len(cand),
        max_abs_err=top([r.max_abs_err for r in cand]),
        max_rel_err=top([r.max_rel_err for r in cand]),
        tolerance=next((r.tolerance for r in cand if r.tolerance), None),
        compared=next((r.compared for r in cand if r.compared), None),
        baseline_err_f64=top([r.err_vs_f64 for r in results["baseline"]]),
        candidate_err_f64=top([r.err_vs_f64 for r in cand]),
        detail=detail,
    )

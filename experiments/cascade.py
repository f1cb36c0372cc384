"""The verification cascade: one experiment, baseline against a patch, cheapest checks first.

    apply -> static -> correctness -> performance -> health

Each stage may end the experiment with a verdict (`_Stop`); whatever happens, every sandbox and
worker is cleaned up (also on Ctrl-C, which propagates after cleanup). Seeds for inputs come from
os.urandom in this process; timing is done by the harness with its own clock.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Callable
from typing import Any

from infra_agent.errors import UserError
from infra_agent.experiments import rules
from infra_agent.experiments.arms import (
    ArmStartError,
    SeedSource,
    arm_set,
    effective_params,
    load_harness,
    patch_refusal,
    sandbox_spec,
)
from infra_agent.experiments.extend import Prior, extension_refusal, same_arms_refusal
from infra_agent.experiments.measure import ArmError, ExperimentTimeout, decide, evidence, measure
from infra_agent.experiments.procwatch import ProcessWatch
from infra_agent.store.base import RunStore
from infra_agent.store.records import ExperimentRecord, now
from infra_agent.store.verdict import (
    CorrectnessEvidence,
    Evidence,
    ExperimentResult,
    Flag,
    SandboxEvidence,
    Verdict,
)
from infra_agent.tasks.harness import Arm, CandidateFailure, CheckResult, Harness, IncorrectOutput
from infra_agent.tasks.manifest import Task
from infra_agent.tasks.patch import (
    NotEditableError,
    Patch,
    apply_patch,
    effective_knobs,
)
from infra_agent.tasks.tree import preview_apply, workspace_folder, workspace_tree

Progress = Callable[[str], None]
WARMUP_SEEDS = 2


class _Stop(Exception):
    """Ends the cascade with a verdict."""

    def __init__(self, verdict: Verdict, *reasons: str, flags: tuple[Flag, ...] = ()) -> None:
        super().__init__(verdict.value)
        self.verdict = verdict
        self.reasons = list(reasons)
        self.flags = list(flags)


def task_fingerprint(task: Task) -> str:
    """sha256 of the manifest, harness, deployment and the baseline workspace (the task folder's
    files, or an installed package's identity with the injected fault): a staleness check."""
    digest = hashlib.sha256()
    files = [task.root / "task.toml", task.harness_path, task.root / "deployment.toml"]
    for path in files:
        if path.is_file():
            digest.update(str(path.relative_to(task.root)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    digest.update(workspace_tree(task).fingerprint().encode())
    return digest.hexdigest()


def _failure(arm: str, error: BaseException) -> _Stop:
    """The verdict for an exception raised while running `arm`."""
    if arm == "baseline":
        return _Stop(
            Verdict.FAILED,
            f"baseline failed, so nothing can be compared (task or sandbox problem): {error}",
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
        f"harness error while running the candidate: {type(error).__name__}: {error}",
    )


class Experiment:
    """State of one run of the cascade."""

    def __init__(
        self, task: Task, patch: Patch, *, backend: str, params: dict[str, Any],
        progress: Progress | None, bootstrap_seed: int, detect: float | None = None,
        prior: Prior | None = None,
    ) -> None:  # fmt: skip
        self.task, self.patch, self.backend = task, patch, backend
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
        """Apply the patch to a scratch copy and read the code it adds."""
        if self.patch.kind != "diff":
            return
        tree = workspace_tree(self.task)
        scratch = preview_apply(self.patch, self.task)
        try:
            before: dict[str, str | None] = {}
            after: dict[str, str | None] = {}
            for rel in self.patch.files:
                new = scratch / "ws" / rel
                before[rel] = tree.read_text(rel) if tree.is_file(rel) else None
                after[rel] = new.read_text(errors="replace") if new.is_file() else None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
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
        self.evidence.extra["static_rules_allowed"] = sorted(
            rules.normalize_allow(self.manifest.allow)
        )
        return ExperimentResult(
            task=self.task.name,
            patch_id=self.patch.hash,
            verdict=verdict,
            reasons=self.reasons,
            flags=list(dict.fromkeys(self.flags)),
            evidence=self.evidence,
        )


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


def run_experiment(
    task: Task,
    patch: Patch,
    *,
    sandbox: str = "local",
    params: dict[str, Any] | None = None,
    store: RunStore | None = None,
    run_id: str | None = None,
    progress: Progress | None = None,
    seed: int | None = None,
    detect: float | None = None,
    extend: ExperimentRecord | None = None,
) -> ExperimentRecord:
    """Run one experiment and return its record (also stored when `store` is given).

    A bad invocation (unknown parameter or backend, a `detect` outside (min_effect, 10) or for a
    rate metric) raises UserError before anything runs or is recorded. A patch this task refuses
    (it does not apply, is too large, targets a missing or non-editable file, sets an unknown knob
    or a bad value) is an experiment too: REJECTED at the apply stage, recorded with its reason.
    `seed` only fixes the statistics' bootstrap; input seeds always come from os.urandom.
    `detect` asks for a finer resolution than the task's (0.05: see a 5% change); the verdict
    says when the budget could not reach it. `extend` continues an unresolved NO_CHANGE of
    the same patch on the same arms (experiments/extend.py: its pairs first, then at most the
    task's max_samples more, at its resolution); any other is a UserError saying why."""
    from infra_agent.sandboxes import create_sandbox, ensure_backend

    if detect is not None and not 0.0 < detect < 10.0:
        raise UserError(f"detect must be a relative change in (0, 10), e.g. 0.05; got {detect}")
    if detect is not None and task.manifest.metric.events is not None:
        raise UserError(
            f"detect applies to a speedup; task '{task.name}' has a rate metric, sampled until "
            "the difference is shown (its target and budget set the precision)"
        )
    if detect is not None and detect <= task.manifest.min_effect:
        raise UserError(
            f"detect {detect:g} is not above the task's min_effect {task.manifest.min_effect:g}: "
            "a change that small is NO_CHANGE by the task's rule, whatever the budget"
        )
    resolved = effective_params(task.manifest, params)
    prior = None
    if extend is not None:
        if detect is not None:
            raise UserError("an extension keeps the earlier experiment's resolution; drop detect")
        why = extension_refusal(extend) or same_arms_refusal(
            extend, task=task.name, fingerprint=task_fingerprint(task), patch_id=patch.hash,
            params=resolved, sandbox=sandbox,
        )  # fmt: skip
        if why is not None:
            raise UserError(f"not extended: {why}")
        prior = Prior.of(extend)
    ensure_backend(sandbox)  # docker: starts a private engine when none answers
    started_at, t0 = now(), time.monotonic()
    refused = patch_refusal(patch, task)
    if refused is not None:
        result = ExperimentResult(
            task=task.name, patch_id=patch.hash, verdict=Verdict.REJECTED,
            reasons=[f"patch refused: {refused}"],
            evidence=Evidence(stage_reached="apply", rule_violations=[refused], params=resolved),
        )  # fmt: skip
    else:
        experiment = Experiment(
            task, patch, backend=sandbox, params=resolved, progress=progress,
            bootstrap_seed=seed if seed is not None else 0, detect=detect, prior=prior,
        )  # fmt: skip
        result = experiment.run(create_sandbox)
    record = ExperimentRecord(
        run_id=run_id,
        task=task.name,
        patch_id=patch.hash,
        sandbox=sandbox,
        result=result,
        started_at=started_at,
        duration_s=round(time.monotonic() - t0, 3),
        target_fingerprint=task_fingerprint(task),
    )
    result.evidence.durations_s["total"] = record.duration_s
    if store is not None:
        with store.transaction():
            store.put_patch(patch.to_record())
            store.put_experiment(record)
    return record


__all__ = ["run_experiment", "task_fingerprint"]

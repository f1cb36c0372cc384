"""What happens after a decision: the waiting agent run resumes, or an approved patch is applied.

- The proposal's run is waiting at the review interrupt: the `Resumer` the caller passes (the CLI
  wires in the agent's `runner.resume_after_review`) continues it; it reads the decision from
  the store. Without one, the proposal records that resumption is pending.
- Otherwise (finished run, or no run) an approved patch is applied:
  a diff becomes a commit on the git branch `infra-agent/<proposal-id>`, either in a
  user-given repository (built with a private index: the user's checkout is not touched) or in a
  git copy of the task's workspace under the data folder; knob changes are merged into the
  deployment's argument file (TOML, table `[server_args]`). The APPLY decision is audited and
  the proposal becomes `applied`.

What is applied is what was verified: the patch's hash is recomputed from the stored bytes and
must be the approved one, and the commit is not a second reading of the diff (`git apply
--cached` could read it differently): the diff is applied to a copy of the task's workspace the
way the experiment applied it (`tasks.patch.apply_patch`, same baseline: the task's fingerprint
must be unchanged), and the files it touched are committed with exactly those bytes.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tomllib

from infra_agent.config import default_data_dir
from infra_agent.errors import UserError
from infra_agent.experiments import task_fingerprint
from infra_agent.private import (
    PRIVATE_UMASK,
    make_tree_private,
    private_dir,
    private_file,
    write_private,
)
from infra_agent.review.queue import get_proposal
from infra_agent.review.staleness import changed_patch, resolve_task, stored_patch
from infra_agent.store.base import RunStore
from infra_agent.store.records import (
    DecisionAction,
    DecisionRecord,
    ProposalRecord,
    ProposalStatus,
    RunStatus,
)
from infra_agent.tasks.checked import PatchedFile, check_patch
from infra_agent.tasks.manifest import Task
from infra_agent.tasks.patch import Patch

BRANCH_PREFIX = "infra-agent/"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "infra-agent review",
    "GIT_AUTHOR_EMAIL": "infra-agent@localhost",
    "GIT_COMMITTER_NAME": "infra-agent review",
    "GIT_COMMITTER_EMAIL": "infra-agent@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def _git(
    repo: Path, *args: str, env: dict[str, str] | None = None, stdin: bytes | None = None
) -> str:
    full_env = {**os.environ, **_GIT_ENV, **(env or {})}
    result = subprocess.run(
        ["git", "-C", str(repo), *args], input=stdin, capture_output=True, env=full_env,
        umask=PRIVATE_UMASK,
    )  # fmt: skip
    out, err = result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")
    if result.returncode != 0:
        first = (err.strip() or out.strip() or "failed").splitlines()[0]
        raise UserError(f"git {args[0]} in {repo}: {first}")
    return out.strip()


VerifiedFile = PatchedFile
"""One file a verified patch touched: its bytes before (the measured baseline) and after (as the
experiment applied the patch), and its git file mode after."""


def verified_files(patch: Patch, task: Task) -> list[VerifiedFile]:
    """The files `patch` touches in `task`'s workspace, applied as an experiment applies it: the
    stored proposal is checked here, once, against the task as it is now."""
    return list(check_patch(patch, task).accepted().files)


def _blob(repo: Path, commit: str, path: str) -> bytes | None:
    result = subprocess.run(
        ["git", "-C", str(repo), "cat-file", "blob", f"{commit}:{path}"],
        capture_output=True, env={**os.environ, **_GIT_ENV},
    )  # fmt: skip
    return result.stdout if result.returncode == 0 else None


def commit_on_branch(repo: Path, files: list[VerifiedFile], branch: str, message: str) -> str:
    """Commit the verified bytes of `files` on top of HEAD as new branch `branch`, without
    touching the checkout (private index). Refused when HEAD's version of a file is not the
    baseline that was measured. Returns the commit id."""
    if _git(repo, "rev-parse", "--is-inside-work-tree") != "true":
        raise UserError(f"{repo} is not a git work tree")
    if (
        subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"],
            capture_output=True,
        ).returncode
        == 0
    ):
        raise UserError(f"branch {branch} already exists in {repo}")
    base = _git(repo, "rev-parse", "HEAD")
    for f in files:
        if _blob(repo, base, f.path) != f.before:
            raise UserError(
                f"{f.path} at HEAD of {repo} is not the baseline the experiment measured; "
                "apply to a checkout of that baseline (or without --repo)"
            )
    with tempfile.TemporaryDirectory(prefix="infra-agent-apply-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git(repo, "read-tree", base, env=env)
        for f in files:
            if f.after is None:
                _git(repo, "update-index", "--force-remove", "--", f.path, env=env)
                continue
            blob = _git(repo, "hash-object", "-w", "--no-filters", "--stdin", stdin=f.after)
            _git(repo, "update-index", "--add", "--cacheinfo", f"{f.mode},{blob},{f.path}", env=env)
        tree = _git(repo, "write-tree", env=env)
    commit = _git(repo, "commit-tree", tree, "-p", base, "-m", message)
    _git(repo, "branch", branch, commit)
    return commit


def workspace_copy(task_root: Path, name: str, data_dir: Path | None = None) -> Path:
    """A git repository holding the task's current workspace on branch `baseline` (created or
    refreshed): approved diffs become branches here when no repository is given."""
    source = task_root / "workspace"
    repo = private_dir((data_dir or default_data_dir()) / "workspaces" / name)
    if not (repo / ".git").is_dir():
        _git(repo, "init", "-q", "-b", "baseline")
    for child in repo.iterdir():
        if child.name != ".git":
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    shutil.copytree(
        source, repo, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    make_tree_private(repo)  # copytree kept the task's modes
    _git(repo, "add", "-A")
    if _git(repo, "status", "--porcelain"):
        _git(repo, "commit", "-q", "-m", f"baseline workspace of task {name}")
    return repo


def merge_knobs(path: Path, knobs: dict[str, Any]) -> None:
    """Merge `knobs` into the `[server_args]` table of the TOML argument file at `path`."""
    args: dict[str, Any] = {}
    if path.exists():
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise UserError(f"argument file {path}: not readable TOML ({exc})") from exc
        extra = set(data) - {"server_args"}
        if extra:
            raise UserError(
                f"argument file {path}: only a [server_args] table is expected, found {sorted(extra)}"
            )
        args = dict(data.get("server_args", {}))
    args.update(knobs)
    lines = [
        "# Server arguments written by infra-agent review (approved knob changes).",
        "[server_args]",
    ]
    for key, value in sorted(args.items()):
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int | float):
            text = repr(value)
        elif isinstance(value, str):
            text = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        else:
            raise UserError(f"knob {key}: value {value!r} cannot go in an argument file")
        lines.append(f'"{key}" = {text}')
    write_private(path, "\n".join(lines) + "\n")


def apply_approved(
    store: RunStore,
    proposal_id: str,
    *,
    reviewer: str,
    repo: Path | None = None,
    args_file: Path | None = None,
    data_dir: Path | None = None,
) -> ProposalRecord:
    """Apply an approved proposal's patch (see module docstring) and mark it applied. Applies
    run one at a time (threads and processes on one data folder): a second apply of a
    proposal is told it is already applied."""
    with _one_apply_at_a_time(data_dir):
        return _apply(store, proposal_id, reviewer, repo, args_file, data_dir)


@contextmanager
def _one_apply_at_a_time(data_dir: Path | None) -> Iterator[None]:
    # One lock for all proposals: two proposals of one task share its workspace copy (git's
    # index.lock), and applies are rare and short.
    path = private_file((data_dir or default_data_dir()) / "locks" / "apply.lock")
    with open(path, "a") as lock:  # released when closed, or if we die
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _apply(
    store: RunStore,
    proposal_id: str,
    reviewer: str,
    repo: Path | None,
    args_file: Path | None,
    data_dir: Path | None,
) -> ProposalRecord:
    proposal = get_proposal(store, proposal_id)
    if proposal.status == ProposalStatus.APPLIED:
        raise UserError(f"proposal {proposal.id} is already applied")
    if proposal.status != ProposalStatus.APPROVED:
        raise UserError(
            f"proposal {proposal.id} is {proposal.status.value}; only approved proposals are applied"
        )
    patch = stored_patch(store, proposal)
    changed = changed_patch(proposal, patch)
    if changed is not None:
        raise UserError(f"refusing to apply {proposal.id}: {changed}")
    if patch.kind == "knobs":
        target = (
            args_file
            or (data_dir or default_data_dir()) / "deployments" / proposal.task / "server_args.toml"
        )
        merge_knobs(target, patch.knobs)
        where = f"argument file {target}"
    else:
        task = resolve_task(proposal)
        if task is None:
            raise UserError(
                f"task '{proposal.task}' cannot be found, so the verified workspace cannot be "
                f"rebuilt to apply {proposal.id}"
            )
        if proposal.target_fingerprint and task_fingerprint(task) != proposal.target_fingerprint:
            raise UserError(
                f"refusing to apply {proposal.id}: task {task.name} changed since its patch was "
                "verified, so the measured workspace cannot be rebuilt"
            )
        files = verified_files(patch, task)
        repo = repo or workspace_copy(task.root, task.name, data_dir)
        branch = BRANCH_PREFIX + proposal.id
        message = f"{proposal.rationale.splitlines()[0] if proposal.rationale else 'infra-agent change'}\n\nproposal {proposal.id}, patch {patch.hash}, approved in review"
        commit = commit_on_branch(repo, files, branch, message)
        where = f"git branch {branch} ({commit[:12]}) in {repo}"
    with store.transaction():
        if not store.set_proposal_status(
            proposal.id, ProposalStatus.APPROVED, ProposalStatus.APPLIED
        ):
            raise UserError(f"proposal {proposal.id} changed while it was being applied")
        current = get_proposal(store, proposal.id)
        current.applied_to = where
        store.put_proposal(current)
        store.add_decision(
            DecisionRecord(
                proposal_id=proposal.id,
                reviewer=reviewer,
                action=DecisionAction.APPLY,
                patch_hash=proposal.patch_hash,
                comment=where,
            )
        )
    return get_proposal(store, proposal.id)


def set_resumption(store: RunStore, proposal_id: str, text: str) -> None:
    with store.transaction():
        current = get_proposal(store, proposal_id)
        current.resumption = text
        store.put_proposal(current)


Resumer = Callable[[Path, str], None]
"""Resumes the run `run_id` of the store at a path, waiting for review: the CLI wires in the
agent's `runner.resume_after_review` (the review queue does not import the agent)."""


def run_is_waiting(store: RunStore, proposal: ProposalRecord) -> bool:
    if proposal.run_id is None:
        return False
    run = store.get_run(proposal.run_id)
    return run is not None and run.status == RunStatus.WAITING_REVIEW


def resume_run(store: RunStore, store_path: Path, proposal_id: str, resume: Resumer | None) -> str:
    """Resume the proposal's waiting run with `resume` (blocking until the agent stops again);
    returns and records what happened: 'resumed', 'pending: ...' or 'failed: ...'."""
    proposal = get_proposal(store, proposal_id)
    assert proposal.run_id is not None
    if resume is None:
        text = f"pending: no agent runner here; resume with: infra-agent optimize --resume {proposal.run_id}"
        set_resumption(store, proposal.id, text)
        return text
    set_resumption(store, proposal.id, "resuming")
    try:
        resume(store_path, proposal.run_id)
    except Exception as exc:  # the agent's failure is reported on the proposal, not raised
        text = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    else:
        run = store.get_run(proposal.run_id)
        text = f"resumed (run now {run.status.value})" if run is not None else "resumed"
    set_resumption(store, proposal.id, text)
    return text


def after_decision(
    store: RunStore,
    store_path: Path,
    proposal_id: str,
    *,
    reviewer: str,
    repo: Path | None = None,
    args_file: Path | None = None,
    data_dir: Path | None = None,
    run_async: Callable[[Callable[[], object]], None] | None = None,
    resume: Resumer | None = None,
) -> ProposalRecord:
    """After a decision: resume the waiting run with `resume` (through `run_async` if given,
    e.g. a thread), or apply an approved patch when no run waits for it. Returns the proposal as
    it is now."""
    proposal = get_proposal(store, proposal_id)
    if run_is_waiting(store, proposal):
        if run_async is None:
            resume_run(store, store_path, proposal.id, resume)
        else:
            set_resumption(store, proposal.id, "queued")
            run_async(lambda: resume_run(store, store_path, proposal.id, resume))
    elif proposal.status == ProposalStatus.APPROVED:
        run = store.get_run(proposal.run_id) if proposal.run_id else None
        if run is not None and run.status == RunStatus.RUNNING:
            set_resumption(
                store,
                proposal.id,
                "pending: the run is still running; it reads the decision itself",
            )
        else:
            return apply_approved(
                store,
                proposal.id,
                reviewer=reviewer,
                repo=repo,
                args_file=args_file,
                data_dir=data_dir,
            )
    return get_proposal(store, proposal.id)

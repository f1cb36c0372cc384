"""The run-store interface. Callers depend on `RunStore`; SQLite is the embedded implementation,
and a server database (PostgreSQL) can implement the same protocol without touching callers."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from infra_agent.store.columns import StepColumns
from infra_agent.store.records import (
    DecisionRecord,
    ExperimentRecord,
    FeedbackRecord,
    PatchRecord,
    ProposalRecord,
    ProposalStatus,
    RunRecord,
    StepRecord,
)

if TYPE_CHECKING:  # pyarrow is only needed by exports
    import pyarrow as pa


class RunStore(Protocol):
    def transaction(self) -> AbstractContextManager[None]:
        """Group writes: all of them land or none does (nested calls join the outer one)."""
        ...

    # runs
    def put_run(self, run: RunRecord) -> None: ...
    def get_run(self, run_id: str) -> RunRecord | None: ...
    def list_runs(self, limit: int = 100) -> list[RunRecord]: ...

    # steps (append-only; seq assigned by the store)
    def add_step(self, step: StepRecord) -> StepRecord: ...
    def steps(self, run_id: str) -> list[StepRecord]: ...

    # patches, experiments, feedback
    def put_patch(self, patch: PatchRecord) -> None: ...
    def get_patch(self, patch_id: str) -> PatchRecord | None: ...
    def put_experiment(self, experiment: ExperimentRecord) -> None: ...
    def get_experiment(self, experiment_id: str) -> ExperimentRecord | None: ...
    def experiments(self, run_id: str | None = None) -> list[ExperimentRecord]: ...
    def put_feedback(self, record: FeedbackRecord) -> None: ...
    def feedback(self, run_id: str | None = None) -> list[FeedbackRecord]: ...

    # review queue
    def put_proposal(self, proposal: ProposalRecord) -> None: ...
    def get_proposal(self, proposal_id: str) -> ProposalRecord | None: ...
    def proposals(
        self, run_id: str | None = None, status: ProposalStatus | None = None
    ) -> list[ProposalRecord]: ...
    def set_proposal_status(
        self, proposal_id: str, expected: ProposalStatus, new: ProposalStatus
    ) -> bool:
        """Compare-and-set: change status only if it is still `expected`. False if someone won."""
        ...

    def add_decision(self, decision: DecisionRecord) -> None: ...
    def decisions(self, proposal_id: str | None = None) -> list[DecisionRecord]: ...

    def iter_runs(self) -> Iterator[RunRecord]: ...
    def close(self) -> None: ...


@runtime_checkable
class BulkReads(Protocol):
    """Optional reads of many runs at once (exports use them when a store offers them; the
    results equal the per-run methods', keyed by run id)."""

    def steps_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[StepRecord]]: ...
    def experiments_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[ExperimentRecord]]: ...
    def patches_by_id(self, patch_ids: Sequence[str]) -> dict[str, PatchRecord]: ...


@runtime_checkable
class TrustedBodies(Protocol):
    """Optional bulk reads of the stored JSON bodies, parsed but not validated again (every body
    was validated when written): `StepRecord` / `ExperimentRecord` in their
    `model_dump(mode="json")` shape, keyed by run id as in `BulkReads`. Exports of many runs use
    them to skip building records they only read a few fields of."""

    def step_bodies_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]: ...
    def experiment_bodies_of_runs(
        self, run_ids: Sequence[str]
    ) -> dict[str, list[dict[str, Any]]]: ...


@runtime_checkable
class ExportColumns(Protocol):
    """Optional bulk reads of the fields exports read, kept by the store as typed columns
    (`store.columns`). Each returns None when the store cannot (a file that predates them)."""

    def step_columns_of_runs(self, run_ids: Sequence[str]) -> StepColumns | None:
        """The steps of `run_ids` (distinct) as one Arrow struct array, runs in that order."""
        ...

    def experiment_columns_of_runs(
        self, run_ids: Sequence[str]
    ) -> dict[str, list[list[Any]]] | None:
        """`BodyFields.experiment_fields_of_runs(run_ids, store.columns.EXPERIMENT_FIELDS)`."""
        ...

    def review_columns(self) -> tuple[list[list[Any]], list[list[Any]]] | None:
        """`BodyFields.review_fields(store.columns.PROPOSAL_FIELDS, ...DECISION_FIELDS)`."""
        ...

    def experiment_table_of_runs(self, run_ids: Sequence[str]) -> pa.Table | None:
        """The experiments of `run_ids` (distinct) as one Arrow table, runs in that order:
        `store.columns.ColumnReader.experiment_table`'s columns."""
        ...

    def review_tables(self) -> tuple[pa.Table, pa.Table] | None:
        """Every proposal and every decision as Arrow tables:
        `store.columns.ColumnReader.review_tables`' columns."""
        ...


@runtime_checkable
class BodyFields(Protocol):
    """Optional bulk reads of a few fields of many stored bodies, picked out by the database
    (parsed, not validated again): for exports that need a handful of an experiment's fields,
    not its sample arrays."""

    def experiment_fields_of_runs(
        self, run_ids: Sequence[str], paths: Sequence[str]
    ) -> dict[str, list[list[Any]]]:
        """Run id -> per experiment (in `BulkReads.experiments_of_runs` order), the values at
        the JSON `paths` (at least two) of its stored body, None where a path is absent."""
        ...

    def review_fields(
        self, proposal_paths: Sequence[str], decision_paths: Sequence[str]
    ) -> tuple[list[list[Any]], list[list[Any]]]:
        """(per proposal in `RunStore.proposals()` order, per decision in `decisions()` order)
        the values at the JSON paths (at least two each) of its stored body."""
        ...

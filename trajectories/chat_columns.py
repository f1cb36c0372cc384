"""The chat messages of a batch of runs as Arrow columns: the Parquet export's fast path.

`rows.run_row` builds each run's conversation as Python dicts, one step at a time, and Arrow then
converts them back, value by value. Here a whole batch's steps are one Arrow struct array
(`STEP_TYPE`): read as such from the store's export columns (`store.columns.StepColumns`), or
converted in one call from the store's parsed step bodies (`trusted.load_trusted_runs`), and
the ATIF mapping of `rows._conversation` is done column-wise (numpy, Arrow compute): no Python code runs
per step or per message.

Column-wise is exact for runs in the *simple* shape, the common one: every tool result answers a
call of the latest message before it, which is the assistant turn that made the call (harness
notes in between are fine: they are never shown), and no two tool results of the run answer the
same call id. Then the conversation is the steps in store order, harness notes left out, each
shown as `rows._conversation` shows it. Any other run (an orphan tool result, a result arriving
after a later message, a repeated call id) goes through `rows.chat_messages` itself, and its
messages take their place among the others (`ChatColumns.message_columns`), so every row equals
`rows.run_row`'s (tests/trajectories/test_chat_columns.py holds them equal, Parquet byte for
byte).

The rest of each row (rewards, metrics, proposals) is `run_columns.RunColumns`', with the step
facts computed here column-wise (message and call counts, token totals, names of the tools
called). Costs, per run of 11 steps on a shared 2-core machine: about 20 us for the mapping,
plus about 20 us to convert step bodies when the steps are not read as columns
(benchmarks/bench_export.py prints the phases).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from infra_agent.store.columns import StepColumns, step_type
from infra_agent.store.records import RunRecord
from infra_agent.trajectories.build import RunBundle
from infra_agent.trajectories.formats import MESSAGE_TYPE, ExportFormat, specs_for_tools
from infra_agent.trajectories.rows import chat_messages, step_bodies

STEP_TYPE = step_type()
"""The fields of a step body (`StepRecord`'s JSON shape) the chat rows read."""

_ROLES = pa.array(["system", "user", "assistant", "tool", "harness"])
_SYSTEM, _USER, _ASSISTANT, _TOOL, _HARNESS = range(5)
WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
"""Every character `str.isspace()` holds true (what `str.strip()` removes)."""
_BLANK = "^[" + "".join(f"\\x{{{ord(c):x}}}" for c in WHITESPACE) + "]*$"
"""RE2: text that `str.strip()` empties (`rows.arguments_text` writes `{}` for it)."""
SKIPS = (None, "no steps recorded", "no assistant message")
"""Why a run forms no chat row (`rows.RunRow.skip`), by `ChatColumns.skip_codes`."""


class ChatColumns:
    """One column-wise pass over the steps of a batch of runs (`runs`, in order).

    `step_metrics(kept)`, `skip(i)` and `tools(i)` give what the rows read of the steps;
    `message_columns(fmt, kept)` the message columns of the kept runs' rows, in `kept` order."""

    def __init__(self, runs: list[RunRecord], columns: StepColumns) -> None:
        """`columns`: the runs' steps, as the store keeps them (`store.columns`) or converted
        from their bodies (`of_bundles`)."""
        self.runs = runs
        steps, counts = columns.steps, columns.counts
        self._steps = steps
        n_runs, n = len(runs), len(steps)
        starts = offsets(counts)
        run_of = np.repeat(np.arange(n_runs), counts)

        role = pc.fill_null(pc.index_in(steps.field("role"), value_set=_ROLES), -1)
        code = role.to_numpy(zero_copy_only=False)
        is_tool, is_asst = code == _TOOL, code == _ASSISTANT
        is_turn = (code >= 0) & (code <= _ASSISTANT)  # system, user, assistant: opens a turn
        calls = steps.field("tool_calls")
        n_call = pc.fill_null(pc.list_value_length(calls), 0).to_numpy(zero_copy_only=False)
        flat_calls = pc.list_flatten(calls)
        call_step = pc.list_parent_indices(calls).to_numpy(zero_copy_only=False)

        # The simple shape: each tool result answers a call of the latest turn before it, an
        # assistant turn of the same run; no call id answered twice in a run; known roles only.
        index = np.arange(n)
        opener = np.maximum.accumulate(np.where(is_turn, index, -1))
        tools = np.flatnonzero(is_tool)
        t_open = opener[tools]
        t_ok = t_open >= starts[run_of[tools]]
        t_ok &= np.where(t_ok, code[np.maximum(t_open, 0)] == _ASSISTANT, False)
        # Call ids and the ids tool results answer as codes of one dictionary (`string_codes`),
        # so (step, id) pairs are integers: step * width + code.
        call_ids = flat_calls.field("id")
        answer = steps.field("tool_call_id").take(pa.array(tools))
        (made_code, answer_code), width = string_codes(call_ids, answer)
        made = call_step * width + made_code
        t_ok &= (answer_code >= 0) & np.isin(t_open * width + answer_code, made)
        _, again, times = np.unique(
            run_of[tools] * width + answer_code, return_inverse=True, return_counts=True
        )
        t_ok &= times[again.reshape(-1)] == 1  # no call id answered twice in a run
        simple = np.ones(n_runs, dtype=bool)
        simple[run_of[tools[~t_ok]]] = False
        simple[run_of[code < 0]] = False
        self.simple = simple

        # Per-run step facts (`rows.StepFacts`), column-wise, as Python values.
        shown = code != _HARNESS
        n_messages = per_run_sums(shown, starts)
        self._starts = starts.tolist()
        self._n_messages = n_messages.tolist()
        self._n_calls = per_run_sums(n_call, starts).tolist()
        self.skip_codes = np.where(per_run_sums(is_asst, starts) > 0, 0, 2)
        """Per run, why it forms no chat row: an index into `SKIPS` (0: it does)."""
        self.skip_codes[np.diff(starts) == 0] = 1
        self._tokens = []
        for key in ("prompt_tokens", "completion_tokens"):
            col = steps.field(key)
            sums = per_run_sums(
                pc.fill_null(col, 0).to_numpy(zero_copy_only=False), starts
            ).tolist()
            valid = per_run_sums(col.is_valid().to_numpy(zero_copy_only=False), starts).tolist()
            self._tokens.append((f"total_{key}", sums, valid))
        self._costs = steps.field("cost_usd").to_pylist()
        # The names of the tools each run called: (run, name) pairs, sorted, one of each.
        names = flat_calls.field("name").dictionary_encode()
        self._names = names.dictionary.to_pylist()
        width = max(len(self._names), 1)
        pairs = np.unique(run_of[call_step] * width + names.indices.to_numpy(zero_copy_only=False))
        self._called_code = pairs % width
        self._called_at = np.searchsorted(pairs // width, np.arange(n_runs + 1))
        self._specs: dict[Any, list[dict[str, Any]]] = {}

        # Every step's message, as `rows._conversation` shows it, harness notes left out. A
        # column is copied only where a value changes (most batches change none): a tool result
        # without content shows its error (or ""), reasoning shows on assistant messages only,
        # a tool call id on tool results only, blank arguments as "{}".
        content, error = steps.field("content"), steps.field("error")
        empty = pc.fill_null(pc.binary_length(content), 0).to_numpy(zero_copy_only=False) == 0
        swap = is_tool & empty
        if swap.any():
            error_shown = pc.if_else(pc.fill_null(pc.not_equal(error, ""), False), error, "")
            content = pc.if_else(pa.array(swap), error_shown, content)
        reasoning = _only(steps.field("reasoning_content"), is_asst)
        answers = _only(steps.field("tool_call_id"), is_tool)
        arguments = flat_calls.field("arguments")
        blank = pc.match_substring_regex(arguments, _BLANK)
        if pc.any(blank).as_py():
            arguments = pc.if_else(blank, "{}", arguments)
        function = pa.StructArray.from_arrays(
            [flat_calls.field("name"), arguments],
            fields=list(MESSAGE_TYPE.field("tool_calls").type.value_type.field("function").type),
        )
        call_values = pa.StructArray.from_arrays(
            [call_ids, pa.repeat("function", len(flat_calls)), function],
            fields=list(MESSAGE_TYPE.field("tool_calls").type.value_type),
        )
        call_offsets = offsets(n_call, np.int32)
        tool_calls = pa.ListArray.from_arrays(
            pa.array(call_offsets),
            call_values,
            type=MESSAGE_TYPE.field("tool_calls").type,
            mask=pa.array(~(is_asst & (n_call > 0))),
        )
        messages = pa.StructArray.from_arrays(
            [steps.field("role"), content, reasoning, tool_calls, answers],
            fields=list(MESSAGE_TYPE),
        )
        self._messages = messages if shown.all() else messages.filter(pa.array(shown))
        self._message_starts = offsets(n_messages)
        m_asst = is_asst[shown]
        # Each run's first assistant message (the rl prompt/completion split), else its end.
        firsts = np.flatnonzero(m_asst)
        at = np.searchsorted(firsts, self._message_starts[:-1])
        first = np.append(firsts, np.iinfo(np.int64).max)[at]
        self._split = np.minimum(first, self._message_starts[1:])

    @classmethod
    def of_bundles(cls, bundles: list[RunBundle]) -> ChatColumns:
        """The columns of run bundles whose steps are the store's parsed bodies (`step_bodies`),
        converted to Arrow in one call. Raises OverflowError when they hold over 2 GiB of text."""
        bodies = [step_bodies(b) for b in bundles]
        counts = np.fromiter((len(s) for s in bodies), dtype=np.int64, count=len(bodies))
        flat = [step for steps in bodies for step in steps]
        steps = pa.array(flat, type=STEP_TYPE)
        if isinstance(steps, pa.ChunkedArray):  # over 2 GiB of text in one batch
            raise OverflowError("a batch's steps do not fit one Arrow array")
        return cls([b.run for b in bundles], StepColumns(steps, counts))

    def step_metrics(self, kept: list[int]) -> dict[str, list[Any]]:
        """`facts`' counts and totals of the runs `kept`, one list each, under the names of the
        rl row's metrics (`n_messages`, `n_tool_calls`, `total_*`)."""
        out: dict[str, list[Any]] = {
            "n_messages": [self._n_messages[i] for i in kept],
            "n_tool_calls": [self._n_calls[i] for i in kept],
        }
        for key, sums, valid in self._tokens:
            out[key] = [sums[i] if valid[i] else None for i in kept]
        costs = self._costs
        starts = self._starts
        totals = []
        for i in kept:
            present = [c for c in costs[starts[i] : starts[i + 1]] if c is not None]
            totals.append(sum(present) if present else None)  # in step order, as `rows`
        out["total_cost_usd"] = totals
        return out

    def bodies(self, i: int) -> list[dict[str, Any]]:
        """Run i's steps as step bodies (`rows.step_bodies`)."""
        lo, hi = self._starts[i], self._starts[i + 1]
        return cast(list[dict[str, Any]], self._steps.slice(lo, hi - lo).to_pylist())

    def skip(self, i: int) -> str | None:
        """Why run i forms no chat row (`rows.RunRow.skip`), None when it does."""
        return SKIPS[self.skip_codes[i]]

    def called(self, i: int) -> set[str]:
        """The names of the tools run i called."""
        codes = self._called_code[self._called_at[i] : self._called_at[i + 1]]
        return {self._names[c] for c in codes.tolist()}

    def tools(self, kept: list[int]) -> tuple[list[list[dict[str, Any]]], np.ndarray]:
        """The tool specs of the rows of runs `kept` (`formats.specs_for_tools`): the distinct
        lists, and the index of each run's. Runs that recorded no tools and called the same ones
        share one list (the writer encodes it once)."""
        at, code = self._called_at, self._called_code
        called_sets: list[Any]
        if len(self._names) <= 63:  # the set of names each run called, as bits
            bits = np.left_shift(np.uint64(1), code.astype(np.uint64))
            sets = np.bitwise_or.reduceat(np.append(bits, np.uint64(0)), at[:-1])
            sets[at[:-1] == at[1:]] = 0  # reduceat gives an empty run its next value
            called_sets = sets[kept].tolist()
        else:
            called_sets = [tuple(code[at[i] : at[i + 1]].tolist()) for i in kept]
        distinct: dict[int, int] = {}
        lists: list[list[dict[str, Any]]] = []
        index = np.empty(len(kept), dtype=np.int64)
        for j, (i, called) in enumerate(zip(kept, called_sets, strict=True)):
            recorded = self.runs[i].config.get("tools")
            if recorded is not None:
                lists.append(specs_for_tools(recorded, self.called(i)))
                index[j] = len(lists) - 1
                continue
            specs = self._specs.get(called)
            if specs is None:
                specs = self._specs[called] = specs_for_tools(None, self.called(i))
            k = distinct.get(id(specs))
            if k is None:
                k = distinct[id(specs)] = len(lists)
                lists.append(specs)
            index[j] = k
        return lists, index

    def message_columns(self, fmt: ExportFormat, kept: list[int]) -> dict[str, pa.Array]:
        """The message columns (`messages`, or `prompt` and `completion`) of the rows of runs
        `kept` (indices into the runs): runs not in the simple shape through
        `rows.chat_messages` itself."""
        lists = pa.list_(MESSAGE_TYPE)
        starts, split = self._message_starts, self._split
        if fmt is ExportFormat.OPENAI_SFT:
            bounds = {"messages": (starts[:-1], starts[1:])}
        else:
            bounds = {"prompt": (starts[:-1], split), "completion": (split, starts[1:])}
        out = {}
        fast = [i for i in kept if self.simple[i]]
        slow = {i: _split(fmt, chat_messages(self.bodies(i))) for i in kept if not self.simple[i]}
        for name, (lo, hi) in bounds.items():
            column = lists_of(self._messages, lo[fast], hi[fast], lists)
            if slow:
                column = pa.concat_arrays(
                    [column, pa.array([m[name] for m in slow.values()], type=lists)]
                )
                order = {i: k for k, i in enumerate([*fast, *slow])}
                column = column.take(pa.array([order[i] for i in kept]))
            out[name] = column
        return out


def _split(fmt: ExportFormat, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A conversation as the row's message fields (as `rows.row_of` splits it)."""
    if fmt is ExportFormat.OPENAI_SFT:
        return {"messages": messages}
    at = next((k for k, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    return {"prompt": messages[:at], "completion": messages[at:]}


def offsets(counts: np.ndarray, dtype: type = np.int64) -> np.ndarray:
    """Where each group starts when groups of `counts` items lie end to end, and the total
    last: [0, c0, c0+c1, ...] (Arrow list offsets, run delimiters)."""
    out: np.ndarray = np.zeros(len(counts) + 1, dtype=dtype)
    np.cumsum(counts, out=out[1:])
    return out


def lists_of(values: pa.Array, lo: np.ndarray, hi: np.ndarray, type_: pa.DataType) -> pa.Array:
    """The lists values[lo[k]:hi[k]], one per k."""
    lengths = hi - lo
    starts = offsets(lengths, np.int32)
    if len(lo) and np.array_equal(lo[1:], hi[:-1]):  # contiguous: no copy
        taken = values.slice(int(lo[0]), int(starts[-1]))
    else:
        index = np.repeat(lo - starts[:-1], lengths) + np.arange(starts[-1])
        taken = values.take(pa.array(index))
    return pa.ListArray.from_arrays(pa.array(starts), taken, type=type_)


def per_run_sums(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per-run sums of per-item `values` (runs delimited by `starts`), exact for integers and
    booleans (a count)."""
    total = offsets(values)
    return total[starts[1:]] - total[starts[:-1]]


def string_codes(*columns: pa.Array | pa.ChunkedArray) -> tuple[list[np.ndarray], int]:
    """The strings of `columns` as codes of one dictionary (int64, one array per column; null:
    -1), and a width past every code: (group, string) pairs become the integers
    group * width + code, distinct for distinct pairs, and a null's (code -1) never equals a
    string's."""
    chunks = [c for column in columns for c in getattr(column, "chunks", [column])]
    encoded = pc.dictionary_encode(pa.chunked_array(chunks, pa.string()).combine_chunks())
    codes = index_codes(encoded.indices)
    bounds = offsets(np.array([len(c) for c in columns], dtype=np.int64)).tolist()
    split = [codes[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return split, len(encoded.dictionary) + 1


def index_codes(indices: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Indices into a dictionary or value set (`dictionary_encode`, `pc.index_in`) as int64,
    nulls as -1."""
    return cast(
        np.ndarray, pc.fill_null(indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    )


def _only(values: pa.Array, where: np.ndarray) -> pa.Array:
    """`values` where `where` holds, null elsewhere (the same array when it is null there)."""
    elsewhere = values.is_valid().to_numpy(zero_copy_only=False) & ~where
    if not elsewhere.any():
        return values
    return pc.if_else(pa.array(where), values, pa.nulls(len(values), values.type))

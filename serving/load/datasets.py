"""Request datasets for serving workloads: random lengths, a coding-agent shape, and replay.

Every dataset is a list of `Session`s; a session is a sequence of turns sent one after another
(each turn's prompt extends the previous prompt and output, as a multi-turn chat does, so the
server's prefix cache can reuse it). Single-turn datasets have one turn per session. Prompts are
token ids drawn from [FIRST_ID, vocab_size) with a seeded generator, so a run is reproducible and
needs no tokenizer or download.

- `random_sessions`: input and output lengths uniform in [len * (1 - range_ratio), len].
- `coding_agent_sessions`: a long prefix shared by all sessions (system prompt and tools), a
  per-session context (the repository), then turns with short user messages and short outputs.
- `replay_sessions`: a recorded request log (JSONL: `input_ids` or `text`, `output_len`,
  optional `session` and `delay_s`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from pydantic import BaseModel, Field

from infra_agent.errors import UserError

FIRST_ID = 3
"""Ids below this are special tokens (unk, bos, eos in the tiny model)."""


class Turn(BaseModel):
    new_ids: list[int] = Field(default_factory=list)
    """Token ids appended to the conversation for this turn (the whole prompt for turn 1)."""
    text: str | None = None
    """A text prompt instead of ids (replayed logs); not combined across turns."""
    output_len: int
    """max_new_tokens for this turn."""
    delay_s: float = 0.0
    """Think time before sending this turn (replay), seconds."""


class Session(BaseModel):
    turns: list[Turn]


def _ids(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    return [rng.randrange(FIRST_ID, vocab_size) for _ in range(n)]


def random_sessions(
    num: int,
    input_len: int,
    output_len: int,
    *,
    vocab_size: int,
    range_ratio: float = 0.5,
    seed: int = 0,
) -> list[Session]:
    rng = random.Random(seed)

    def length(n: int) -> int:
        return max(1, rng.randint(int(n * (1 - range_ratio)), n))

    return [
        Session(
            turns=[
                Turn(
                    new_ids=_ids(rng, length(input_len), vocab_size), output_len=length(output_len)
                )
            ]
        )
        for _ in range(num)
    ]


def coding_agent_sessions(
    num: int,
    *,
    vocab_size: int,
    shared_prefix_len: int = 1024,
    context_len: int = 512,
    turns: int = 3,
    user_len: int = 48,
    output_len: int = 24,
    seed: int = 0,
) -> list[Session]:
    """Long shared prefix + per-session context, then short turns: the coding-agent shape."""
    rng = random.Random(seed)
    shared = _ids(rng, shared_prefix_len, vocab_size)
    sessions = []
    for _ in range(num):
        first = shared + _ids(rng, context_len, vocab_size) + _ids(rng, user_len, vocab_size)
        ts = [Turn(new_ids=first, output_len=output_len)]
        ts += [
            Turn(new_ids=_ids(rng, user_len, vocab_size), output_len=output_len)
            for _ in range(turns - 1)
        ]
        sessions.append(Session(turns=ts))
    return sessions


def replay_sessions(path: Path, *, limit: int | None = None) -> list[Session]:
    """Sessions from a JSONL request log; lines of one `session` keep their order."""
    if not path.is_file():
        raise UserError(f"{path}: request log not found")
    by_session: dict[str, list[Turn]] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            turn = Turn(
                new_ids=[int(i) for i in row.get("input_ids", [])],
                text=row.get("text"),
                output_len=int(row["output_len"]),
                delay_s=float(row.get("delay_s", 0.0)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{path}:{lineno}: not a request record ({exc})") from exc
        if not turn.new_ids and turn.text is None:
            raise UserError(f"{path}:{lineno}: needs 'input_ids' or 'text'")
        by_session.setdefault(str(row.get("session", lineno)), []).append(turn)
    sessions = [Session(turns=t) for t in by_session.values()]
    return sessions[:limit] if limit is not None else sessions

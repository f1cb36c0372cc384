"""Who is reviewing: reviewer tokens, browser sessions and CSRF tokens.

A reviewer opens the start-up URL with `?token=...` (like Jupyter); a valid token starts a
session (random id in an HttpOnly, SameSite=Strict cookie) and the token is dropped from the URL.
Each session carries a synchronizer CSRF token that every POST must echo in its form. Tokens are
compared in constant time. Sessions live in memory: restarting the server logs everyone out.
A session ends when the reviewer signs out, after `idle_timeout_s` without a request, or
`max_age_s` after it started, whichever comes first; an ended session's cookie is worth nothing
and its reviewer must open the token URL again.
"""

from __future__ import annotations

import getpass
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

SESSION_COOKIE = "infra_agent_review"
IDLE_TIMEOUT_S = 8 * 3600.0
"""A session unused this long ends (seconds)."""
MAX_AGE_S = 24 * 3600.0
"""A session ends this long after it started, however busy (seconds)."""


@dataclass
class Session:
    reviewer: str
    started: float
    """When the session started (the auth's clock, seconds)."""
    last_seen: float
    """The session's latest request (the auth's clock, seconds)."""
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    flashes: list[tuple[str, str]] = field(default_factory=list)
    """(kind, message) shown once on the next page: kind is 'ok' or 'error'."""


class ReviewerAuth:
    """Reviewer name -> token, and the live sessions. `clock` (seconds, monotonic) is
    injectable so tests can age sessions."""

    def __init__(
        self,
        tokens: dict[str, str],
        *,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not tokens:
            raise ValueError("at least one reviewer token is needed")
        for name, token in tokens.items():
            if len(token) < 8:
                raise ValueError(f"reviewer {name}: token too short (8 characters at least)")
        if idle_timeout_s <= 0 or max_age_s <= 0:
            raise ValueError("session lifetimes must be positive")
        self.tokens = dict(tokens)
        self.idle_timeout_s = idle_timeout_s
        self.max_age_s = max_age_s
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    @classmethod
    def generated(
        cls,
        reviewer: str | None = None,
        *,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_age_s: float = MAX_AGE_S,
    ) -> ReviewerAuth:
        """One reviewer (the local user by default) with a fresh random token."""
        try:
            name = reviewer or getpass.getuser()
        except Exception:  # no user name in a container: any name will do
            name = "reviewer"
        token = secrets.token_urlsafe(24)
        return cls({name: token}, idle_timeout_s=idle_timeout_s, max_age_s=max_age_s)

    def reviewer_for_token(self, token: str) -> str | None:
        found = None
        for name, expected in self.tokens.items():
            if hmac.compare_digest(token.encode(), expected.encode()):
                found = name
        return found

    def start_session(self, reviewer: str) -> str:
        session_id = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            for stale in [k for k, v in self._sessions.items() if self._ended(v, now)]:
                del self._sessions[stale]
            self._sessions[session_id] = Session(reviewer=reviewer, started=now, last_seen=now)
        return session_id

    def session(self, session_id: str | None) -> Session | None:
        """The live session of this id (its last request now), or None: unknown, signed out or
        expired (an expired one is forgotten)."""
        if not session_id:
            return None
        now = self._clock()
        with self._lock:
            found = self._sessions.get(session_id)
            if found is None:
                return None
            if self._ended(found, now):
                del self._sessions[session_id]
                return None
            found.last_seen = now
            return found

    def end_session(self, session_id: str | None) -> None:
        """Sign out: the session's cookie stops working at once."""
        with self._lock:
            self._sessions.pop(session_id or "", None)

    def live_sessions(self) -> int:
        now = self._clock()
        with self._lock:
            return sum(not self._ended(v, now) for v in self._sessions.values())

    def _ended(self, session: Session, now: float) -> bool:
        return (
            now - session.last_seen > self.idle_timeout_s or now - session.started > self.max_age_s
        )

    @staticmethod
    def csrf_ok(session: Session, submitted: str | None) -> bool:
        return bool(submitted) and hmac.compare_digest(
            session.csrf.encode(), str(submitted).encode()
        )

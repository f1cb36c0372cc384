"""Who is reviewing: reviewer tokens, browser sessions and CSRF tokens.

A reviewer opens the start-up URL with `?token=...` (like Jupyter); a valid token starts a
session (random id in an HttpOnly, SameSite=Strict cookie) and the token is dropped from the URL.
Each session carries a synchronizer CSRF token that every POST must echo in its form. Tokens are
compared in constant time. Sessions live in memory: restarting the server logs everyone out.
"""

from __future__ import annotations

import getpass
import hmac
import secrets
import threading
from dataclasses import dataclass, field

SESSION_COOKIE = "infra_agent_review"


@dataclass
class Session:
    reviewer: str
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    flashes: list[tuple[str, str]] = field(default_factory=list)
    """(kind, message) shown once on the next page: kind is 'ok' or 'error'."""


class ReviewerAuth:
    """Reviewer name -> token, and the live sessions."""

    def __init__(self, tokens: dict[str, str]) -> None:
        if not tokens:
            raise ValueError("at least one reviewer token is needed")
        for name, token in tokens.items():
            if len(token) < 8:
                raise ValueError(f"reviewer {name}: token too short (8 characters at least)")
        self.tokens = dict(tokens)
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    @classmethod
    def generated(cls, reviewer: str | None = None) -> ReviewerAuth:
        """One reviewer (the local user by default) with a fresh random token."""
        try:
            name = reviewer or getpass.getuser()
        except Exception:  # no user name in a container: any name will do
            name = "reviewer"
        return cls({name: secrets.token_urlsafe(24)})

    def reviewer_for_token(self, token: str) -> str | None:
        found = None
        for name, expected in self.tokens.items():
            if hmac.compare_digest(token.encode(), expected.encode()):
                found = name
        return found

    def start_session(self, reviewer: str) -> str:
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions[session_id] = Session(reviewer=reviewer)
        return session_id

    def session(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        with self._lock:
            return self._sessions.get(session_id)

    @staticmethod
    def csrf_ok(session: Session, submitted: str | None) -> bool:
        return bool(submitted) and hmac.compare_digest(
            session.csrf.encode(), str(submitted).encode()
        )

"""Signed-in people, in memory: a random session id -> the person's token, identity and CSRF token.

Nothing is written to disk; a restarted console forgets every session (people sign in again). A session
ends when the person signs out, after `idle_s` without a request, or `max_age_s` after sign-in, whichever
comes first. Pure: the clock is injected.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

MAX_AGE_S: Final = 8 * 3600.0
IDLE_S: Final = 3600.0
MAX_SESSIONS: Final = 1000  # beyond this the least recently used session ends: memory stays bounded


@dataclass
class Session:
    id: str
    token: str = field(repr=False)
    username: str
    groups: tuple[str, ...]
    csrf: str = field(repr=False)
    created: float
    used: float

    def csrf_matches(self, offered: str | None) -> bool:
        return offered is not None and hmac.compare_digest(self.csrf.encode(), offered.encode())


class SessionStore:
    def __init__(self, max_age_s: float = MAX_AGE_S, idle_s: float = IDLE_S, max_sessions: int = MAX_SESSIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.idle_s = idle_s
        self.max_sessions = max_sessions
        self.clock = clock
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, token: str, username: str, groups: tuple[str, ...]) -> tuple[Session, list[Session]]:
        """A new session, and the sessions it pushed out (over max_sessions), for the caller to close."""
        now = self.clock()
        session = Session(secrets.token_urlsafe(32), token, username, groups, secrets.token_urlsafe(32), now, now)
        ended = self.expire()
        while len(self._sessions) >= self.max_sessions:
            oldest = min(self._sessions.values(), key=lambda s: s.used)
            ended.append(self._sessions.pop(oldest.id))
        self._sessions[session.id] = session
        return session, ended

    def get(self, session_id: str | None) -> Session | None:
        """The live session of this id (and it counts as used now), or None: unknown, signed out or expired."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        now = self.clock()
        if self._expired(session, now):
            return None  # expire() removes it (and the caller's clean-up closes what it holds)
        session.used = now
        return session

    def end(self, session_id: str | None) -> Session | None:
        return self._sessions.pop(session_id, None) if session_id else None

    def expire(self) -> list[Session]:
        """Remove and return the sessions that have expired."""
        now = self.clock()
        ended = [s for s in self._sessions.values() if self._expired(s, now)]
        for session in ended:
            del self._sessions[session.id]
        return ended

    def _expired(self, session: Session, now: float) -> bool:
        return now - session.created >= self.max_age_s or now - session.used >= self.idle_s

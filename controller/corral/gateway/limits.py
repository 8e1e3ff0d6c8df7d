"""Per-caller bounds on the HTTP gateway: open sessions and open streams per authenticated username, and an idle
session ends even while its GET stream stays open.

Why these and not the SDK's own: its session limit is global (10,000), so one caller that fills it shuts every
other caller out, and its idle timeout counts an open GET stream as activity, so a client that opens one and
goes quiet keeps its session (and the leases the session holds) for ever.

Why per username, not per token: whoever holds a ServiceAccount can mint tokens at will, and all of them name
the same user. The username is what the API server said the token is (KubeTokenVerifier's review).

Why 300 s idle: it is the default idle TTL of a lease (a lease held by a session ends with the session), so a
session that goes quiet loses its lease no sooner than the lease itself would have lapsed. A client that wants
a lease to outlive its session passes its own `holder` to iot.acquire; such a lease follows only its TTL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.obs import metrics

log = logging.getLogger(__name__)

DEFAULT_SESSIONS_PER_CALLER: Final = 32
DEFAULT_STREAMS_PER_CALLER: Final = 64  # requests in flight at once: GET streams, waiting tool calls, listens
DEFAULT_SESSION_IDLE_S: Final = 300.0
# JSON-RPC's implementation-defined server errors are -32000..-32099; this one reads as HTTP's 429.
CALLER_LIMIT: Final = -32029
SESSION_HEADER: Final = b"mcp-session-id"
_PROTOCOL_HEADER: Final = b"mcp-protocol-version"
_WARN_EVERY_S: Final = 60.0


@dataclass(frozen=True)
class Bounds:
    sessions_per_caller: int = DEFAULT_SESSIONS_PER_CALLER
    streams_per_caller: int = DEFAULT_STREAMS_PER_CALLER
    idle_s: float = DEFAULT_SESSION_IDLE_S

    def __post_init__(self) -> None:
        if self.sessions_per_caller < 1 or self.streams_per_caller < 1:
            raise ValueError("a caller must be allowed at least 1 session and 1 stream")
        if not 0 < self.idle_s < float("inf"):
            raise ValueError("the session idle timeout must be a positive number of seconds")


@dataclass
class _Session:
    caller: str
    last_active: float
    requests: int = 0  # client requests in flight other than its GET stream


class Ledger:
    """Who holds which sessions and streams, and which sessions went idle: bookkeeping only, no I/O."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self._sessions: dict[str, _Session] = {}
        self._held: Counter[str] = Counter()  # caller -> sessions open or being opened
        self._streams: Counter[str] = Counter()

    def session_count(self) -> int:
        return len(self._sessions)

    def sessions_of(self, caller: str) -> int:
        return self._held[caller]

    def streams_of(self, caller: str) -> int:
        return self._streams[caller]

    def reserve_session(self, caller: str) -> str | None:
        """Room for one more session of `caller` (None), or why not. A reservation ends in opened() or unreserve()."""
        limit = self.bounds.sessions_per_caller
        if self._held[caller] >= limit:
            return (f"{caller} already has {self._held[caller]} open MCP sessions, the most one caller may have "
                    f"(corral mcp --max-sessions-per-caller {limit}). End one (HTTP DELETE with its Mcp-Session-Id) "
                    f"or let one idle out ({self.bounds.idle_s:g} s without a request) before opening another.")
        self._held[caller] += 1
        return None

    def unreserve(self, caller: str) -> None:
        self._drop(caller)

    def opened(self, caller: str, session_id: str, now: float) -> None:
        """The reservation became session `session_id` (it already counts)."""
        self._sessions[session_id] = _Session(caller, now)

    def ended(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self._drop(session.caller)

    def begin_stream(self, caller: str) -> str | None:
        limit = self.bounds.streams_per_caller
        if self._streams[caller] >= limit:
            return (f"{caller} already has {self._streams[caller]} requests open at this gateway, the most one caller "
                    f"may have (corral mcp --max-streams-per-caller {limit}). Close a stream or wait for an answer "
                    "before sending more.")
        self._streams[caller] += 1
        return None

    def end_stream(self, caller: str) -> None:
        self._streams[caller] -= 1
        if self._streams[caller] <= 0:
            del self._streams[caller]

    def request_begins(self, session_id: str, caller: str, now: float) -> bool:
        """A client request on the session: it keeps the session alive, if it is the session's own caller's (the
        SDK answers anyone else 404). Whether it counted."""
        session = self._sessions.get(session_id)
        if session is None or session.caller != caller:
            return False
        session.requests += 1
        session.last_active = now
        return True

    def request_ends(self, session_id: str, now: float) -> None:
        session = self._sessions.get(session_id)
        if session is not None:
            session.requests = max(0, session.requests - 1)
            session.last_active = now

    def idle(self, now: float) -> list[str]:
        """Sessions with no client request for idle_s: a GET stream they hold open does not count."""
        return [sid for sid, s in self._sessions.items()
                if s.requests == 0 and now - s.last_active >= self.bounds.idle_s]

    def _drop(self, caller: str) -> None:
        self._held[caller] -= 1
        if self._held[caller] <= 0:
            del self._held[caller]


def caller_of(scope: Scope) -> str | None:
    user = scope.get("user")
    if not isinstance(user, AuthenticatedUser):
        return None
    return user.access_token.subject or user.access_token.client_id


def _header(scope: Scope, name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in scope.get("headers") or [] if k == name), None)


def opens_a_session(scope: Scope) -> bool:
    """A request the SDK would answer by opening a session: a handshake-era POST without a session id (2026-07-28
    requests carry a later protocol version and have no sessions)."""
    version = _header(scope, _PROTOCOL_HEADER)
    return (scope.get("method") == "POST" and _header(scope, SESSION_HEADER) is None
            and (version is None or version in HANDSHAKE_PROTOCOL_VERSIONS))


async def refuse(send: Send, message: str, kind: str, limit: int, retry_after_s: float) -> None:
    """HTTP 429 with a JSON-RPC error body (no id: the request was not read), as the SDK answers its own limits."""
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {
        "code": CALLER_LIMIT, "message": message, "data": {"limit": kind, "max": limit}}}).encode()
    await send({"type": "http.response.start", "status": 429, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(max(1, round(retry_after_s))).encode())]})
    await send({"type": "http.response.body", "body": body})


Terminate = Callable[[str], Awaitable[None]]


class Bounded:
    """ASGI: the MCP endpoint behind per-caller bounds (see the module). `terminate(session_id)` ends a session the
    way the SDK's idle timeout does; the SDK tells `ended()` when any session is gone."""

    def __init__(self, app: ASGIApp, bounds: Bounds, terminate: Terminate,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.ledger = Ledger(bounds)
        self.terminate = terminate
        self.clock = clock
        self._reaper: asyncio.Task[None] | None = None
        self._warned: dict[tuple[str, str], float] = {}

    def ended(self, session_id: str) -> None:
        self.ledger.ended(session_id)
        metrics.MCP_SESSIONS.set(self.ledger.session_count())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        caller = caller_of(scope)
        if caller is None:  # the token guard in front answers 401 first; nothing to count
            await self.app(scope, receive, send)
            return
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap())
        bounds = self.ledger.bounds
        why = self.ledger.begin_stream(caller)
        if why is not None:
            await self._refuse(send, caller, why, "streams", bounds.streams_per_caller, 1.0)
            return
        try:
            if opens_a_session(scope):
                await self._open(caller, scope, receive, send)
            else:
                await self._serve(caller, scope, receive, send)
        finally:
            self.ledger.end_stream(caller)

    async def _open(self, caller: str, scope: Scope, receive: Receive, send: Send) -> None:
        bounds = self.ledger.bounds
        why = self.ledger.reserve_session(caller)
        if why is not None:
            await self._refuse(send, caller, why, "sessions", bounds.sessions_per_caller, bounds.idle_s)
            return
        opened = False

        async def watch(message: Message) -> None:
            nonlocal opened
            if message["type"] == "http.response.start" and message["status"] < 400 and not opened:
                session_id = next((v.decode("latin-1") for k, v in message.get("headers") or []
                                   if k.lower() == SESSION_HEADER), None)
                if session_id is not None:  # recorded before the client can learn the id and use it
                    opened = True
                    self.ledger.opened(caller, session_id, self.clock())
                    metrics.MCP_SESSIONS.set(self.ledger.session_count())
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            if not opened:
                self.ledger.unreserve(caller)

    async def _serve(self, caller: str, scope: Scope, receive: Receive, send: Send) -> None:
        session_id = _header(scope, SESSION_HEADER)
        counted = (session_id is not None and scope.get("method") != "GET"  # a GET stream is not activity
                   and self.ledger.request_begins(session_id, caller, self.clock()))
        try:
            await self.app(scope, receive, send)
        finally:
            if counted:
                assert session_id is not None
                self.ledger.request_ends(session_id, self.clock())

    async def _refuse(self, send: Send, caller: str, why: str, kind: str, limit: int, retry_after_s: float) -> None:
        metrics.MCP_CALLER_LIMITED.labels(limit=kind).inc()
        now = self.clock()
        if now - self._warned.get((caller, kind), -_WARN_EVERY_S) >= _WARN_EVERY_S:  # one line a minute, not a flood
            if len(self._warned) > 1000:
                self._warned = {k: at for k, at in self._warned.items() if now - at < _WARN_EVERY_S}
            self._warned[(caller, kind)] = now
            log.warning("refused a request at the per-caller limit: %s", why)
        await refuse(send, why, kind, limit, retry_after_s)

    async def _reap(self) -> None:
        every = min(5.0, self.ledger.bounds.idle_s / 4)
        while True:
            await asyncio.sleep(every)
            for session_id in self.ledger.idle(self.clock()):
                log.info("MCP session %s idle for %g s (an open GET stream does not count): ending it",
                         session_id[:16], self.ledger.bounds.idle_s)
                try:
                    await self.terminate(session_id)
                except Exception:  # one session that will not end must not stop the reaper
                    log.exception("could not end idle MCP session %s", session_id[:16])
                self.ended(session_id)


def raise_fd_limit() -> tuple[int, int]:
    """The soft limit on open files raised to the hard one (every session's GET stream and every waiting call is a
    socket): (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as err:
            log.warning("could not raise the open-files limit from %d to %d: %s", soft, wanted, err)
            return soft, soft
    return soft, max(soft, wanted)


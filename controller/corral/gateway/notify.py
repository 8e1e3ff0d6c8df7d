"""Change notices to one caller's MCP clients, on both protocol generations, coalesced.

- Handshake-era sessions (2025-11-25 and before) get `notifications/tools/list_changed`
  and, for URIs they subscribed to with `resources/subscribe`, `notifications/resources/updated`,
  on the session's standalone channel.
- 2026-07-28 clients open `subscriptions/listen` streams; the SDK's ListenHandler
  serves them from this caller's own bus, so one caller never hears of another's devices.

A new subscriber first gets an update for everything it subscribed to (read it now:
the snapshot), then one per change. Changes to one URI are sent at most once per
`min_interval_s`, so a flapping sensor cannot flood a client; the last change in a
burst is always delivered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from mcp.server.session import ServerSession
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)

log = logging.getLogger(__name__)

TOOLS = "tools"  # the coalescing key of the tool list


class SnapshotBus(InMemorySubscriptionBus):
    """A bus whose new listeners first hear of every URI `snapshot()` names (the ListenHandler drops
    the ones the stream did not ask for, and delivers them only after its acknowledgement)."""

    def __init__(self, snapshot: Callable[[], list[str]]) -> None:
        super().__init__()
        self._snapshot = snapshot

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        unsubscribe = super().subscribe(listener)
        for uri in self._snapshot():
            listener(ResourceUpdated(uri=uri))
        return unsubscribe


class Audience:
    def __init__(self, snapshot: Callable[[], list[str]], visible: Callable[[str], bool], min_interval_s: float) -> None:
        self.bus = SnapshotBus(snapshot)
        self.listen = ListenHandler(self.bus, max_subscriptions=64)
        self._visible = visible
        self._min_interval_s = min_interval_s
        self._sessions: dict[int, tuple[ServerSession, set[str]]] = {}
        self._last_sent: dict[str, float] = {}
        self._scheduled: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def listeners(self) -> int:
        return len(self._sessions) + len(self.bus._listeners)

    def join(self, session: ServerSession) -> None:
        """Remember a handshake-era session so it hears of tool list changes."""
        self._sessions.setdefault(id(session._connection), (session, set()))

    def subscribe(self, session: ServerSession, uri: str) -> None:
        self.join(session)
        self._sessions[id(session._connection)][1].add(uri)
        self._spawn(self._send_legacy(session, uri))  # the snapshot notice, after the subscribe response

    def unsubscribe(self, session: ServerSession, uri: str) -> None:
        entry = self._sessions.get(id(session._connection))
        if entry:
            entry[1].discard(uri)

    def changed(self, key: str) -> None:
        """A URI (or TOOLS) changed: notify now, or once the minimum interval since the last notice has passed."""
        if key in self._scheduled or not self._heard(key):
            return  # already due (it will carry this change too), or nobody would hear it
        loop = asyncio.get_running_loop()
        wait = self._last_sent.get(key, -1e9) + self._min_interval_s - loop.time()
        self._scheduled[key] = loop.call_later(max(0.0, wait), self._fire, key)

    def _heard(self, key: str) -> bool:
        """Whether anyone listens for this key: a bus stream, or a session (subscribed to it, for a URI)."""
        if self.bus._listeners:
            return True
        return any(key == TOOLS or key in uris for _, uris in self._sessions.values())

    def close(self) -> None:
        for handle in self._scheduled.values():
            handle.cancel()
        self._scheduled.clear()
        self.listen.close()

    def _fire(self, key: str) -> None:
        self._scheduled.pop(key, None)
        self._last_sent[key] = asyncio.get_running_loop().time()
        self._spawn(self._deliver(key))

    async def _deliver(self, key: str) -> None:
        if key != TOOLS and not self._visible(key):
            return  # it is gone from this caller's view; its disappearance shows in the tool and device lists
        await self.bus.publish(ToolsListChanged() if key == TOOLS else ResourceUpdated(uri=key))
        for session, uris in list(self._sessions.values()):
            if key == TOOLS:
                await self._send_legacy(session, None)
            elif key in uris:
                await self._send_legacy(session, key)

    async def _send_legacy(self, session: ServerSession, uri: str | None) -> None:
        try:
            if uri is None:
                await session.send_tool_list_changed()
            else:
                await session.send_resource_updated(uri)
        except Exception as err:  # noqa: BLE001 - a closed session: forget it
            log.debug("dropping an MCP session that cannot be notified: %s", err)
            self._sessions.pop(id(session._connection), None)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

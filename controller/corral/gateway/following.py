"""Following Intents to their outcome, asynchronously, with the caller's own credentials.

A caller may wait minutes for a human's approval. Waiting must hold no thread: every thread a waiting
caller held would be one fewer for everybody else's tool calls. So the gateway follows Intents on the
event loop (`kube.client`), with the caller's client configuration: the same API server, CA, bearer
token or client certificate, and impersonation headers.

A caller who may list and watch Intents in a namespace gets one watch there, kept while it has waiters
(and a minute after): a tool call then costs no request of its own to follow its Intent, only the events
of a watch that is already open. A caller without those rights is polled, still without a thread.
Every wait also reads its Intent once after it registered, so an outcome written before the watch saw
it is not missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from corral.api.codes import GROUP, VERSION
from corral.kube.client import ApiError, AsyncApi, path_of

log = logging.getLogger(__name__)

Body = dict[str, Any]
Done = Callable[[Body], bool]
POLL_S = 0.05
CHECK_S = 1.0  # how often a waiter reads for itself while its watch is down
IDLE_S = 60.0  # a namespace watch without waiters is closed after this long
WATCH_S = 300  # the server ends a watch after this; it is opened again from where it stood


class _Waiter:
    def __init__(self, done: Done) -> None:
        self.done = done
        self.future: asyncio.Future[Body] = asyncio.get_running_loop().create_future()

    def offer(self, intent: Body) -> None:
        if not self.future.done() and self.done(intent):
            self.future.set_result(intent)


class _NamespaceWatch:
    """All Intents of one namespace, watched from now on, handed to whoever waits for one of them."""

    def __init__(self, api: AsyncApi, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.waiters: dict[str, list[_Waiter]] = {}
        self.idle_since = time.monotonic()
        self.healthy = asyncio.Event()
        self.since: float | None = None  # since when (monotonic) the watch has followed without a gap
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"intents watch {namespace}")

    def close(self) -> None:
        self._task.cancel()

    @property
    def closed(self) -> bool:
        return self._task.done()

    def add(self, name: str, waiter: _Waiter) -> None:
        self.waiters.setdefault(name, []).append(waiter)

    def remove(self, name: str, waiter: _Waiter) -> None:
        waiting = self.waiters.get(name, [])
        if waiter in waiting:
            waiting.remove(waiter)
        if not waiting:
            self.waiters.pop(name, None)
        if not self.waiters:
            self.idle_since = time.monotonic()

    async def _run(self) -> None:
        collection = path_of(GROUP, VERSION, "intents", self.namespace)
        backoff = 0.5
        while True:
            try:
                # Where the namespace stands now (one item, not all of them), then everything after it.
                started = time.monotonic()
                listed = await self.api.request("GET", collection, params={"limit": "1"})
                version = listed["metadata"]["resourceVersion"]
                self.since = started
                self.healthy.set()
                await self._recheck_waiters()  # whatever happened while no watch was open
                while True:
                    async for event in self.api.watch(collection, {"resourceVersion": version,
                                                                  "timeoutSeconds": str(WATCH_S)}, WATCH_S):
                        backoff = 0.5
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            raise ApiError(int(obj.get("code") or 500), str(obj.get("message") or "watch error"))
                        version = (obj.get("metadata") or {}).get("resourceVersion", version)
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            for waiter in list(self.waiters.get(obj["metadata"]["name"], [])):
                                waiter.offer(obj)
            except asyncio.CancelledError:
                raise
            except ApiError as err:
                self.healthy.clear()
                self.since = None
                if err.status in (401, 403):
                    log.info("Intent watch in %s refused (%s); its waiters read instead", self.namespace, err)
                    return
                log.info("Intent watch in %s broke (%s); opening it again", self.namespace, err)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
            except Exception as err:  # noqa: BLE001 - network trouble: open it again
                self.healthy.clear()
                self.since = None
                log.info("Intent watch in %s broke (%s); opening it again", self.namespace, err)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _recheck_waiters(self) -> None:
        for name, waiting in list(self.waiters.items()):
            with contextlib.suppress(ApiError):
                intent = await self.api.request("GET", path_of(GROUP, VERSION, "intents", self.namespace, name))
                for waiter in list(waiting):
                    waiter.offer(intent)


class IntentFollower:
    """One caller's asynchronous calls on Intents."""

    def __init__(self, api: AsyncApi, may_watch: Callable[[str], bool] = lambda namespace: False) -> None:
        self.api = api
        self.may_watch = may_watch  # namespace -> whether the caller may list and watch Intents there
        self._watches: dict[str, _NamespaceWatch] = {}

    async def close(self) -> None:
        for watch in self._watches.values():
            watch.close()
        self._watches.clear()
        await self.api.close()

    async def get(self, namespace: str, name: str) -> Body:
        return await self.api.request("GET", path_of(GROUP, VERSION, "intents", namespace, name))

    async def until(self, namespace: str, name: str, done: Done, timeout_s: float, created_at: float | None = None
                    ) -> Body:
        """The Intent once `done(intent)`, or as it is when timeout_s runs out.

        `created_at` (monotonic): when the caller started creating the Intent. If the namespace's watch has
        followed without a gap since before then, it sees every change of the Intent, and the Intent need
        not be read first.
        """
        deadline = time.monotonic() + timeout_s
        watch = self._watch(namespace)
        if watch is None:
            return await self._poll(namespace, name, done, deadline)
        waiter = _Waiter(done)
        watch.add(name, waiter)
        try:
            if created_at is None or watch.since is None or watch.since > created_at:
                waiter.offer(await self.get(namespace, name))  # it may have settled before the watch could tell
            while not waiter.future.done():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return await self.get(namespace, name)
                await asyncio.wait([waiter.future], timeout=min(remaining, CHECK_S))
                if not waiter.future.done() and not watch.healthy.is_set():
                    waiter.offer(await self.get(namespace, name))  # the watch is down: read instead
            return waiter.future.result()
        finally:
            watch.remove(name, waiter)
            self._close_idle()

    async def _poll(self, namespace: str, name: str, done: Done, deadline: float) -> Body:
        while True:
            intent = await self.get(namespace, name)
            if done(intent) or time.monotonic() >= deadline:
                return intent
            await asyncio.sleep(POLL_S)

    def _watch(self, namespace: str) -> _NamespaceWatch | None:
        watch = self._watches.get(namespace)
        if watch is not None and not watch.closed:
            return watch
        if not self.may_watch(namespace):
            return None
        watch = self._watches[namespace] = _NamespaceWatch(self.api, namespace)
        return watch

    def _close_idle(self) -> None:
        now = time.monotonic()
        for namespace, watch in list(self._watches.items()):
            if not watch.waiters and now - watch.idle_since > IDLE_S:
                watch.close()
                del self._watches[namespace]

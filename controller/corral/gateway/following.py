"""Following Intents to their outcome, asynchronously, with the caller's own credentials.

A caller may wait minutes for a human's approval. Waiting must hold no thread: every thread a waiting
caller held would be one fewer for everybody else's tool calls. So the gateway follows Intents on the
event loop (`kube.client`), with the caller's client configuration: the same API server, CA, bearer
token or client certificate, and impersonation headers.

A caller who may list and watch Intents in a namespace gets one watch there (the shared informer,
kube.informer.Informer, with the caller's client), kept while it has waiters (and a minute after): a tool call then costs no request of its own to follow its Intent, only the events
of a watch that is already open. A caller without those rights is polled, still without a thread.
Every wait also reads its Intent once after it registered, so an outcome written before the watch saw
it is not missed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from corral.api.codes import GROUP, VERSION
from corral.kube.cache import key_of
from corral.kube.client import ApiError, AsyncApi, path_of
from corral.kube.informer import Informer
from corral.kube.typed import Body

log = logging.getLogger(__name__)

Done = Callable[[Body], bool]
POLL_S = 0.05
CHECK_S = 1.0  # how often a waiter reads for itself while its watch is down
IDLE_S = 60.0  # a namespace watch without waiters is closed after this long


class _Waiter:
    def __init__(self, done: Done) -> None:
        self.done = done
        self.future: asyncio.Future[Body] = asyncio.get_running_loop().create_future()

    def offer(self, intent: Body) -> None:
        if not self.future.done() and self.done(intent):
            self.future.set_result(intent)


class _NamespaceWatch:
    """All Intents of one namespace, listed then watched (kube.informer.Informer, with the caller's client), handed
    to whoever waits for one of them. Each (re)list hands every Intent over again: whatever happened while no watch
    was open reaches the waiters too."""

    def __init__(self, api: AsyncApi, namespace: str) -> None:
        self.namespace = namespace
        self.waiters: dict[str, list[_Waiter]] = {}
        self.idle_since = time.monotonic()
        self.healthy = asyncio.Event()
        self.since: float | None = None  # since when (monotonic) the watch has followed without a gap
        self._informer = Informer(api, GROUP, VERSION, "intents", "", (namespace,), self._offer, on_state=self._state)
        self._stopping: asyncio.Task[None] | None = None
        self._informer.start()

    def close(self) -> None:
        if self._stopping is None:
            self._stopping = asyncio.get_running_loop().create_task(self._informer.stop())

    async def stop(self) -> None:
        self.close()
        assert self._stopping is not None
        await self._stopping

    @property
    def closed(self) -> bool:
        return self._stopping is not None

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

    def _offer(self, kind: str, intent: Body) -> None:
        if kind == "DELETED":
            return
        for waiter in list(self.waiters.get(key_of(intent)[1], [])):
            waiter.offer(intent)

    def _state(self, namespace: str | None, err: Exception | None) -> None:
        if err is None:
            self.since = time.monotonic()  # after the list: no later than the watch really started following
            self.healthy.set()
            return
        self.healthy.clear()
        self.since = None
        if isinstance(err, ApiError) and err.status in (401, 403):
            log.info("Intent watch in %s refused (%s); its waiters read instead", self.namespace, err)
            self.close()


class IntentFollower:
    """One caller's asynchronous calls on Intents."""

    def __init__(self, api: AsyncApi, may_watch: Callable[[str], bool] = lambda namespace: False) -> None:
        self.api = api
        self.may_watch = may_watch  # namespace -> whether the caller may list and watch Intents there
        self._watches: dict[str, _NamespaceWatch] = {}

    async def close(self) -> None:
        for watch in self._watches.values():
            await watch.stop()
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

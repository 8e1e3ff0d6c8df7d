"""A list-then-watch of one kind with a label selector, on the event loop: what kopf does not offer.

kopf filters by label after it has received every object; for Secrets that would mean reading every Secret
of a namespace. This informer asks the API server for the labelled ones only (the enrollment credentials),
lists them, then watches from the list's resourceVersion, and lists again after a gap (410 Gone, a broken
connection). Handlers get ("ADDED" | "MODIFIED" | "DELETED", object) on the loop, and `synced` is set once
the first list of every namespace has been handed over. The gateway watches with each caller's own client the
same way: a field selector narrows a watch to one object, and `on_state` hears when a namespace's watch is
following (after a list was handed over) or broke (with why), for callers who must know when to read instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from corral.kube.cache import Body, key_of
from corral.kube.client import ApiError, AsyncApi, path_of
from corral.kube.tasks import cancel_all

log = logging.getLogger(__name__)

Handler = Callable[[str, Body], None]
StateHandler = Callable[[str | None, Exception | None], None]  # namespace, None (following) or why it broke
WATCH_S = 300


class Informer:
    def __init__(self, api: AsyncApi, group: str, version: str, plural: str, label_selector: str,
                 namespaces: tuple[str, ...], handler: Handler, *, field_selector: str = "",
                 on_state: StateHandler | None = None) -> None:
        self.api = api
        self.group, self.version, self.plural = group, version, plural
        self.selector = label_selector
        self.selectors = {"labelSelector": label_selector, **({"fieldSelector": field_selector} if field_selector else {})}
        self.on_state = on_state
        self.namespaces: tuple[str | None, ...] = namespaces or (None,)
        self.handler = handler
        self.synced = asyncio.Event()
        self._listed: set[str | None] = set()
        self._known: dict[str | None, dict[tuple[str, str], Body]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run(ns), name=f"informer {self.plural} {ns or '*'}")
                       for ns in self.namespaces]

    async def stop(self) -> None:
        await cancel_all(self._tasks)

    async def _run(self, namespace: str | None) -> None:
        collection = path_of(self.group, self.version, self.plural, namespace)
        backoff = 0.5
        while True:
            try:
                listed = await self.api.request("GET", collection, params=self.selectors)
                self._replace(namespace, listed.get("items") or [])
                version = listed["metadata"]["resourceVersion"]
                self._state(namespace, None)
                while True:
                    params = {**self.selectors, "resourceVersion": version, "timeoutSeconds": str(WATCH_S)}
                    async for event in self.api.watch(collection, params, WATCH_S):
                        backoff = 0.5
                        obj, kind = event.get("object") or {}, event.get("type")
                        if kind == "ERROR":
                            raise ApiError(int(obj.get("code") or 500), str(obj.get("message") or "watch error"))
                        version = (obj.get("metadata") or {}).get("resourceVersion", version)
                        if kind in ("ADDED", "MODIFIED", "DELETED"):
                            self._deliver(namespace, str(kind), obj)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - an expired version or a broken connection: list again
                level = logging.INFO if isinstance(err, ApiError) and err.status == 410 else logging.WARNING
                log.log(level, "watch of %s (%s) in %s broke: %s; listing again", self.plural, self.selector,
                        namespace or "all namespaces", err)
                self._state(namespace, err)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    def _state(self, namespace: str | None, err: Exception | None) -> None:
        if self.on_state is not None:
            self.on_state(namespace, err)

    def _replace(self, namespace: str | None, items: list[Body]) -> None:
        known = self._known.setdefault(namespace, {})
        fresh = {key_of(item): item for item in items}
        for key in [k for k in known if k not in fresh]:
            self._deliver(namespace, "DELETED", known[key])
        for item in items:
            self._deliver(namespace, "ADDED" if key_of(item) not in known else "MODIFIED", item)
        self._listed.add(namespace)
        if self._listed >= set(self.namespaces):
            self.synced.set()

    def _deliver(self, namespace: str | None, kind: str, obj: Body) -> None:
        known = self._known.setdefault(namespace, {})
        if kind == "DELETED":
            known.pop(key_of(obj), None)
        else:
            known[key_of(obj)] = obj
        try:
            self.handler(kind, obj)
        except Exception:
            log.exception("handling %s %s of %s failed", kind, key_of(obj), self.plural)

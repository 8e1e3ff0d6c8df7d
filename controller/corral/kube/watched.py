"""A kind the controller watches and reconciles itself, typed where it enters: listed then watched (an Informer)
into a TypedCache, so that each object becomes its model once, and one worker reconciling the keys the events
put on a queue.

Apart from the informer because this is the small controller built on it (cache, queue, worker), which the
guards (Interlocks, AgentPauses) are. An object its model refuses is never acted on as if it were read: it is
kept aside in `refused`, with what was wrong, and its subclass says so on it (a condition, an Event).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Generic

from corral.kube.cache import Key, TypedCache, TypedChange, key_of
from corral.kube.client import AsyncApi
from corral.kube.informer import Informer
from corral.kube.tasks import cancel_all
from corral.kube.typed import Body, M, Malformed
from corral.kube.workqueue import Result, WorkQueue, run_workers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refused:
    """An object its model refused, as it came, and why: what a subclass needs to say so on it."""

    body: Body
    error: Malformed

    @property
    def uid(self) -> str | None:
        return _uid(self.body)

    @property
    def generation(self) -> int | None:
        generation = self.body["metadata"].get("generation")
        return int(generation) if isinstance(generation, int) else None

    @property
    def status(self) -> Any:
        """The status as it came (None when there is none): read leniently, for what it already says."""
        return self.body.get("status")


class WatchedKind(Generic[M]):
    """One kind, listed then watched into `objects` (its models), with one worker reconciling the keys put on
    `queue`. Subclasses say what a change means (`changed`, `deleted`, `refused_one`) and what the worker does
    (`reconcile`)."""

    def __init__(self, api: AsyncApi, model: type[M], group: str, version: str, plural: str,
                 namespaces: tuple[str, ...]) -> None:
        self.objects: TypedCache[M] = TypedCache(model)
        self.refused: dict[Key, Refused] = {}
        self.queue: WorkQueue[Key] = WorkQueue(plural)
        self.informer = Informer(api, group, version, plural, "", namespaces, self.on_event)
        self._worker: asyncio.Task[None] | None = None

    @property
    def synced(self) -> asyncio.Event:
        """Set once every watched namespace was listed: before that, nothing may be decided or driven."""
        return self.informer.synced

    def start(self) -> None:
        self.informer.start()
        self._worker = asyncio.create_task(run_workers(self.queue, self.reconcile, 1),
                                           name=f"corral-{self.informer.plural}")

    async def stop(self) -> None:
        self.queue.close()
        await cancel_all([self._worker])
        await self.informer.stop()

    def on_event(self, event_type: str, body: Body) -> None:
        """A watch event, typed here: the model of a newer version, a deletion, or an object its model refuses."""
        key = key_of(body)
        if event_type == "DELETED":
            self.refused.pop(key, None)
            self.deleted(key, self.objects.remove(body), _uid(body))
            return
        try:
            change = self.objects.upsert(body)
        except Malformed as err:
            log.warning("%s", err)
            self.refused[key] = refused = Refused(body, err)
            self.refused_one(key, refused)
            return
        if change is not None:
            self.refused.pop(key, None)
            self.changed(change)

    def changed(self, change: TypedChange[M]) -> None:
        raise NotImplementedError

    def deleted(self, key: Key, before: M | None, uid: str | None) -> None:
        raise NotImplementedError

    def refused_one(self, key: Key, refused: Refused) -> None:
        raise NotImplementedError

    async def reconcile(self, key: Key) -> Result:
        raise NotImplementedError


def _uid(body: Body) -> str | None:
    uid = body["metadata"].get("uid")
    return str(uid) if uid else None


def generation_changed(change: TypedChange[Any]) -> bool:
    """Whether the spec moved (or the object is new): the generation predicate, on models."""
    return change.before is None or change.before.metadata.generation != change.after.metadata.generation

"""The controller's copies of Kubernetes objects: newest wins, whoever brings it.

Objects reach the controller two ways: watch events, and the responses of its own writes. Both go into
one cache per kind, and an object replaces the cached one only if it is newer (a higher resourceVersion),
so a watch event that is older than a write response never overwrites it, and the controller never
reacts to its own writes a second time when their watch events arrive.

Resource versions are compared as integers, as kube-apiserver with etcd issues them; should a server hand
out another form, the incoming object is taken as newer, which is the behaviour without this rule.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic

from corral.kube.typed import Body, M, Malformed, parse

Key = tuple[str, str]  # namespace, name

_TOMBSTONES = 4096


def key_of(body: Body) -> Key:
    meta = body["metadata"]
    return meta.get("namespace") or "", meta["name"]


def newer(incoming: Body, cached: Body) -> bool:
    """Whether incoming is a later version of cached (same uid and a higher resourceVersion)."""
    if incoming["metadata"].get("uid") != cached["metadata"].get("uid"):
        return True  # another object under the same name: it replaced the cached one
    return _version(incoming) > _version(cached)


def _version(body: Body) -> float:
    text = body["metadata"].get("resourceVersion") or ""
    return int(text) if text.isdigit() else float("inf")


@dataclass(frozen=True)
class Change:
    """What an accepted object changed: whether it is new, and whether its spec (generation) moved."""

    key: Key
    before: Body | None
    after: Body

    @property
    def created(self) -> bool:
        return self.before is None

    @property
    def generation_changed(self) -> bool:
        return self.before is None or _generation(self.before) != _generation(self.after)


def _generation(body: Body) -> int | None:
    generation = body["metadata"].get("generation")
    return int(generation) if generation is not None else None


class ObjectCache:
    """Objects of one kind by (namespace, name)."""

    def __init__(self) -> None:
        self._bodies: dict[Key, Body] = {}
        # Deleted objects by key -> (uid, resourceVersion): a write response that was already on its way when
        # the DELETED event came must not bring the object back.
        self._deleted: OrderedDict[Key, tuple[str | None, str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._bodies)

    def __contains__(self, key: Key) -> bool:
        return key in self._bodies

    def get(self, key: Key) -> Body | None:
        return self._bodies.get(key)

    def items(self) -> list[tuple[Key, Body]]:
        return list(self._bodies.items())

    def upsert(self, body: Body) -> Change | None:
        """Keep body if it is newer than what is cached; None when it is not (nothing changed)."""
        key = key_of(body)
        cached = self._bodies.get(key)
        if cached is not None and not newer(body, cached):
            return None
        tomb = self._deleted.get(key)
        if tomb is not None:
            uid, version = tomb
            if body["metadata"].get("uid") == uid and not newer(body, {"metadata": {"uid": uid, "resourceVersion": version}}):
                return None
            del self._deleted[key]
        self._bodies[key] = body
        return Change(key, cached, body)

    def remove(self, body: Body) -> Body | None:
        """Forget the object (a DELETED event); returns what was cached."""
        key = key_of(body)
        meta = body["metadata"]
        self._deleted[key] = (meta.get("uid"), meta.get("resourceVersion") or "")
        self._deleted.move_to_end(key)
        while len(self._deleted) > _TOMBSTONES:
            self._deleted.popitem(last=False)
        return self._bodies.pop(key, None)


@dataclass(frozen=True)
class TypedChange(Generic[M]):
    """A Change with both sides as their models."""

    key: Key
    before: M | None
    after: M

    @property
    def created(self) -> bool:
        return self.before is None


class TypedCache(Generic[M]):
    """Objects of one kind by (namespace, name), each validated into its model once, when it enters.

    The freshness rules are ObjectCache's (newest resourceVersion wins, deleted stays deleted); what comes out is
    the model. A body the model refuses raises `Malformed` and leaves nothing of that object in the cache: the
    caller says so on the object, and nothing acts on a version it cannot read.
    """

    def __init__(self, model: type[M]) -> None:
        self.model = model
        self.raw = ObjectCache()
        self._objects: dict[Key, M] = {}

    def __len__(self) -> int:
        return len(self._objects)

    def __contains__(self, key: Key) -> bool:
        return key in self._objects

    def get(self, key: Key) -> M | None:
        return self._objects.get(key)

    def body(self, key: Key) -> Body | None:
        """The object as the API server sent it, for the few places that pass it on unchanged."""
        return self.raw.get(key)

    def items(self) -> list[tuple[Key, M]]:
        return list(self._objects.items())

    def values(self) -> list[M]:
        return list(self._objects.values())

    def upsert(self, body: Body) -> TypedChange[M] | None:
        """Keep body if it is newer than what is cached (None when it is not); `Malformed` if its model refuses it."""
        # Freshness first: a stale copy (a watch echo of our own write, a relist) is neither parsed nor allowed to
        # evict a newer version; a refused one is remembered as deleted, so its repeats are not refused again.
        if self.raw.upsert(body) is None:
            return None
        key = key_of(body)
        try:
            obj = parse(self.model, body)
        except Malformed:
            self.raw.remove(body)
            self._objects.pop(key, None)
            raise
        before = self._objects.get(key)
        self._objects[key] = obj
        return TypedChange(key, before, obj)

    def remove(self, body: Body) -> M | None:
        """Forget the object (a DELETED event); returns what was cached."""
        self.raw.remove(body)
        return self._objects.pop(key_of(body), None)

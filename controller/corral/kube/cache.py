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
from typing import Any

Key = tuple[str, str]  # namespace, name
Body = dict[str, Any]

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

"""The controller's Devices, as models, also indexed by the device id each one claims (`spec.deviceId`).

Each Device is validated into `api.device.Device` once, when it enters (a watch event or the answer to the
controller's own write), on `kube.cache.TypedCache`'s newest-wins rule; the reconciler and the port read
`device.spec.target`, never the body. Two things are kept as they were before models:

- a status the model cannot read counts as no status (the controller then writes it whole), as it always did;
- a Device whose spec or metadata the model refuses is not driven: it is kept aside as `Refused`, with what was
  wrong, so that the reconciler says so on it (an Event and a condition) instead of failing on it.

`get`, `bound` and `items` hand out the bodies as the API server sent them, for what passes them on unread
(the interlocks judge over bodies, the target applier needs managedFields).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError, ValidatorFunctionWrapHandler, field_validator

from corral.api.device import Device, DeviceStatus
from corral.kube.cache import Key, TypedCache, key_of
from corral.kube.typed import Body, Malformed


class _Readable(Device):
    """A Device as the cache reads it: a status in a shape the model refuses is no status (it is rewritten)."""

    @field_validator("status", mode="wrap")
    @classmethod
    def _unreadable_status_is_none(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> DeviceStatus | None:
        try:
            status: DeviceStatus | None = handler(value)
        except ValidationError:
            return None
        return status


@dataclass(frozen=True)
class DeviceChange:
    """What an upsert changed: the Device before and after, or `refused` when its model refused the new body."""

    key: Key
    before: Device | None
    after: Device | None
    refused: Refused | None = None

    @property
    def generation_changed(self) -> bool:
        """kubebuilder's generation predicate: a new Device or a new spec; and a refused one, which is told so."""
        if self.after is None:
            return True
        return self.before is None or self.before.metadata.generation != self.after.metadata.generation


@dataclass(frozen=True)
class Refused:
    """A Device the model refused: which device id it claims (if that much is readable) and what was wrong."""

    key: Key
    device_id: str | None
    uid: str | None
    generation: int | None
    error: Malformed
    body: Body


class DeviceCache:
    """Device objects by (namespace, name), also indexed by `spec.deviceId` (which Devices claim which device)."""

    def __init__(self) -> None:
        self._objects = TypedCache[Device](_Readable)
        self._by_device_id: dict[str, set[Key]] = {}
        self.refused: dict[Key, Refused] = {}

    def __len__(self) -> int:
        return len(self._objects)

    def __contains__(self, key: Key) -> bool:
        return key in self._objects

    def upsert(self, body: Body) -> DeviceChange | None:
        """Keep body if it is newer than what is cached (None when it is not). When the model refuses it, nothing of
        the object stays in the cache (nothing acts on a version the controller cannot read): the change says
        `refused`."""
        key = key_of(body)
        before = self._objects.get(key)
        try:
            change = self._objects.upsert(body)
        except Malformed as err:
            self._unindex(key, before)
            refused = self.refused[key] = _refusal(key, body, err)
            return DeviceChange(key, before, None, refused)
        if change is None:
            return None
        self.refused.pop(key, None)
        self._unindex(key, change.before)
        self._by_device_id.setdefault(change.after.spec.device_id, set()).add(key)
        return DeviceChange(key, change.before, change.after)

    def remove(self, body: Body) -> Device | None:
        """Forget the Device (a DELETED event); returns what was cached."""
        key = key_of(body)
        self.refused.pop(key, None)
        old = self._objects.remove(body)
        self._unindex(key, old)
        return old

    def _unindex(self, key: Key, old: Device | None) -> None:
        if old is None:
            return
        keys = self._by_device_id.get(old.spec.device_id, set())
        keys.discard(key)
        if not keys:
            self._by_device_id.pop(old.spec.device_id, None)

    # ---- models ---------------------------------------------------------------------------------------------

    def device(self, key: Key) -> Device | None:
        return self._objects.get(key)

    def devices(self) -> list[Device]:
        return self._objects.values()

    def claims(self, device_id: str) -> list[Device]:
        """Devices claiming device_id, oldest first (the oldest wins a duplicate claim)."""
        found = [device for key in self._by_device_id.get(device_id, ()) if (device := self._objects.get(key))]
        return sorted(found, key=_age)

    def refusals(self, device_id: str) -> list[Refused]:
        """Devices claiming device_id that the model refused."""
        return [refused for refused in self.refused.values() if refused.device_id == device_id]

    def device_ids(self) -> list[str]:
        return list(self._by_device_id)

    # ---- bodies, for what passes them on --------------------------------------------------------------------

    def get(self, key: Key) -> Body | None:
        return self._objects.body(key) if key in self._objects else None

    def bound(self, device_id: str) -> list[Body]:
        """The bodies of `claims(device_id)`, in its order."""
        return [body for device in self.claims(device_id) if (body := self.get(key_of_device(device))) is not None]

    def items(self) -> list[tuple[Key, Body]]:
        return [(key, body) for key, _ in self._objects.items() if (body := self._objects.body(key)) is not None]


def key_of_device(device: Device) -> Key:
    return device.metadata.namespace or "", device.metadata.name or ""


def _age(device: Device) -> tuple[float, str]:
    created = device.metadata.creation_timestamp
    return (created.timestamp() if created is not None else float("-inf")), device.metadata.name or ""


def _refusal(key: Key, body: Body, err: Malformed) -> Refused:
    """What can be read of a refused Device: the device id it claims, its uid and generation, if well formed."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") if isinstance(body.get("spec"), dict) else {}
    device_id, generation = (spec or {}).get("deviceId"), meta.get("generation")
    return Refused(key, device_id if isinstance(device_id, str) and device_id else None, meta.get("uid"),
                   generation if isinstance(generation, int) else None,
                   Malformed("Device", err.namespace, err.name, err.problems), body)


def device_id_of(device: Device | Body | None) -> str | None:
    """The device id a Device claims; from a body for callers that still hold bodies."""
    if isinstance(device, Device):
        return device.spec.device_id
    device_id = ((device or {}).get("spec") or {}).get("deviceId")
    return device_id if isinstance(device_id, str) else None

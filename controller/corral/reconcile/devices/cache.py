"""The controller's Devices, also indexed by the device id each one claims (`spec.deviceId`)."""

from __future__ import annotations

from corral.kube.cache import Body, Change, Key, ObjectCache, key_of


class DeviceCache(ObjectCache):
    """Device objects, also indexed by `spec.deviceId` (which Devices claim which device)."""

    def __init__(self) -> None:
        super().__init__()
        self._by_device_id: dict[str, set[Key]] = {}

    def upsert(self, body: Body) -> Change | None:
        change = super().upsert(body)
        if change is not None:
            self._unindex(change.key, change.before)
            device_id = device_id_of(body)
            if device_id:
                self._by_device_id.setdefault(device_id, set()).add(change.key)
        return change

    def remove(self, body: Body) -> Body | None:
        old = super().remove(body)
        self._unindex(key_of(body), old)
        return old

    def _unindex(self, key: Key, old: Body | None) -> None:
        device_id = device_id_of(old) if old is not None else None
        if not device_id:
            return
        keys = self._by_device_id.get(device_id, set())
        keys.discard(key)
        if not keys:
            self._by_device_id.pop(device_id, None)

    def bound(self, device_id: str) -> list[Body]:
        """Devices claiming device_id, oldest first (the oldest wins a duplicate claim)."""
        bodies = [self._bodies[k] for k in self._by_device_id.get(device_id, ())]
        return sorted(bodies, key=lambda b: (b["metadata"].get("creationTimestamp") or "", b["metadata"]["name"]))

    def device_ids(self) -> list[str]:
        return list(self._by_device_id)


def device_id_of(body: Body | None) -> str | None:
    device_id = ((body or {}).get("spec") or {}).get("deviceId")
    return device_id if isinstance(device_id, str) else None

"""Setting a Device's target for an Intent, without undoing another Intent's.

Server-side apply replaces the whole set of fields a manager owns: an apply by `corral-intents` must
repeat every target field that earlier Intents set, or the API server removes them (or, from an old copy,
puts an old value back). Two rules make that set right:

- Intents for one Device are executed one at a time (`intents.IntentReconciler.execute`), so no other
  `corral-intents` apply for the Device is in flight while one is computed;
- the set is computed from the newest copy of the Device this process has: the applier keeps the answer
  of its own last apply per Device, and a copy older than that (a watch cache that lags) never wins.

Fields other managers own (a person's `kubectl apply`) are not in the set, and server-side apply leaves
them alone. A field a person took over since this process last saw the Device makes the apply conflict;
then the Device is read from the API server and the set computed again. A conflict on the Intent's own
field is the person's setting, and is never overwritten: FieldConflict.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from datetime import datetime
from typing import Any, Protocol

from corral.api.codes import INTENTS_MANAGER
from corral.api.device import Device
from corral.kube.cache import Key, key_of, newer
from corral.kube.objects import FieldConflict
from corral.kube.typed import Body
from corral.reconcile.devices.cache import device_id_of
from corral.reconcile.doors import OPEN, Doors

log = logging.getLogger(__name__)

_REMEMBERED = 50_000


def owned_target(device: Body, manager: str = INTENTS_MANAGER) -> dict[str, Any]:
    """Target entries this field manager applied before: a new apply must repeat them, or they are removed."""
    target = (device.get("spec") or {}).get("target") or {}
    owned: dict[str, Any] = {}
    for entry in managed_fields(device):
        if entry.get("manager") != manager or entry.get("operation") != "Apply":
            continue
        fields = ((entry.get("fieldsV1") or {}).get("f:spec") or {}).get("f:target") or {}
        for name in fields:
            key = name.removeprefix("f:")
            if name.startswith("f:") and key in target:
                owned[key] = target[key]
    return owned


def managed_fields(device: Body | Device) -> list[dict[str, Any]]:
    """The object's managedFields: the model keeps them as they came (ObjectMeta allows what it does not name)."""
    if isinstance(device, Device):
        return list((device.metadata.model_extra or {}).get("managedFields") or [])
    return list(device["metadata"].get("managedFields") or [])


def target_set_at(device: Body | Device, actuator: str) -> datetime | None:
    """When spec.target[actuator] was last set, as the API server's managedFields tell it: the newest time of a
    field manager that owns it. A manager's time moves whenever it changes the Device at all, so this is never
    earlier than the true moment (a target looks younger, never older). None when no entry says."""
    times = []
    for entry in managed_fields(device):
        fields = ((entry.get("fieldsV1") or {}).get("f:spec") or {}).get("f:target") or {}
        if f"f:{actuator}" in fields and entry.get("time"):
            try:
                times.append(datetime.fromisoformat(str(entry["time"]).replace("Z", "+00:00")))
            except ValueError:
                continue
    return max(times) if times else None


def intent_target(device: Body, actuator: str, value: Any) -> dict[str, Any]:
    """The whole `corral-intents` target after this Intent: what earlier Intents set, and this value."""
    return {**owned_target(device), actuator: value}


class TargetApi(Protocol):
    async def apply_intent_target(self, namespace: str, device: str, target: dict[str, Any], intent: str) -> Body: ...

    async def get_device(self, namespace: str, name: str) -> Body: ...


class TargetApplier:
    doors: Doors = OPEN  # the controller's, set where it is wired: only the device's owner applies its targets

    def __init__(self, api: TargetApi) -> None:
        self.api = api
        self._written: OrderedDict[Key, Body] = OrderedDict()
        self.recomputed = 0  # applies computed again from a fresh read, for tests and benchmarks

    async def apply(self, device: Body, actuator: str, value: Any, intent: str) -> Body:
        """Set target[actuator] = value on the Device, keeping every other `corral-intents` field.

        `device` is the newest copy the caller has; it may be older than this applier's last answer for it.
        Returns the Device as written. FieldConflict when another manager owns the Intent's field.
        """
        self.doors.check(device_id_of(device), "applying a target")
        key = key_of(device)
        remembered = self._written.get(key)
        latest = remembered if remembered is not None and not newer(device, remembered) else device
        namespace, name = key
        try:
            written = await self.api.apply_intent_target(namespace, name, intent_target(latest, actuator, value), intent)
        except FieldConflict:
            fresh = await self.api.get_device(namespace, name)
            if owned_target(fresh) == owned_target(latest):
                raise  # the conflict is on this Intent's own field
            self.recomputed += 1
            log.info("target apply for %s on %s/%s: another manager took over a field since; computing again",
                     intent, namespace, name)
            written = await self.api.apply_intent_target(namespace, name, intent_target(fresh, actuator, value), intent)
        self._written[key] = written
        self._written.move_to_end(key)
        while len(self._written) > _REMEMBERED:
            self._written.popitem(last=False)
        return written

"""Facts about Devices: Events for people, and records in the audit log, which is the record.

Posting never waits for the API server (`audit.events.EventRecorder` queues them), and a fact never waits
for the disk (`AuditLog.note` writes it with the next batch, and keeps it while the log cannot be
written). Some notices are one-offs per cause (a refused contract, a drift at one generation): `once()`
remembers which were posted.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from corral.api.codes import API_VERSION
from corral.api.device import Device
from corral.audit.log import AuditLog
from corral.kube.events import EventRecorder, ObjectRef
from corral.kube.typed import Body
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.runtime import DeviceRuntime

Kind = Literal["Normal", "Warning"]


def device_ref(device: Device | Body) -> ObjectRef:
    """The Device an Event regards. A body is still taken from the Intent controller, until it reads models."""
    if not isinstance(device, Device):
        meta = device["metadata"]
        return ObjectRef(API_VERSION, "Device", meta["name"], meta.get("namespace"), meta.get("uid"))
    return ObjectRef(API_VERSION, "Device", device.metadata.name or "", device.metadata.namespace,
                     device.metadata.uid)


def as_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


class DeviceNotices:
    def __init__(self, recorder: EventRecorder, devices: DeviceCache, audit: AuditLog | None = None) -> None:
        self.recorder = recorder
        self.devices = devices
        self.audit = audit

    def fact(self, kind: str, device: Device | str, data: dict[str, Any], trace: str | None = None) -> None:
        """An audit record about a Device (the model, or the device id it is bound to, if it is)."""
        if self.audit is None:
            return
        found = device if isinstance(device, Device) else next(iter(self.devices.claims(device)), None)
        device_id = device if isinstance(device, str) else device.spec.device_id
        if found is not None:
            meta = found.metadata
            subject, uid = f"{meta.namespace}/{meta.name}", meta.uid
        else:
            subject, uid = f"device-id/{device_id}", None
        self.audit.note(kind, subject, {"deviceId": device_id, **data}, uid=uid, trace=trace)

    def post(self, device: Device, reason: str, action: str, note: str, type_: Kind = "Normal") -> None:
        self.recorder.post(device_ref(device), reason, action, note, type_)

    def post_for(self, device_id: str, reason: str, action: str, note: str, type_: Kind = "Normal") -> None:
        """On the Device bound to device_id, if there is one."""
        bound = self.devices.claims(device_id)
        if bound:
            self.post(bound[0], reason, action, note, type_)

    def once(self, rt: DeviceRuntime, device: Device, key: str, reason: str, action: str, note: str,
             type_: Kind = "Normal", fact: tuple[str, dict[str, Any]] | None = None) -> None:
        """The Event (and the audit record, when there is one) only the first time for this key."""
        if key in rt.announced:
            return
        rt.announced.add(key)
        self.post(device, reason, action, note, type_)
        if fact is not None:
            self.fact(fact[0], device, fact[1])

    def state_changed(self, rt: DeviceRuntime, changed: dict[str, tuple[Any, Any]], cause: str,
                      device: Device | None = None, event: bool = True) -> None:
        """An audit record of the change with its cause, and a StateChanged Event (unless `event` is False, or
        this is the first state heard)."""
        if not changed:
            return
        after = {k: v for k, (_, v) in changed.items()}
        before = {k: b for k, (b, _) in changed.items()}
        self.fact("device.state_changed", device if device is not None else rt.device_id,
                  {"before": before, "after": after, "cause": cause})
        if not event or all(b is None for b in before.values()):
            return  # on record; the first state heard is no news for people
        note = f"Reported state changed: {as_json(after)} (before: {as_json(before)}); cause: {cause}"
        if device is not None:
            self.post(device, "StateChanged", "Report", note)
        else:
            self.post_for(rt.device_id, "StateChanged", "Report", note)

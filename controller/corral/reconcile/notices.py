"""Events about Devices, for people: what was sent, what changed and why, what was refused.

Posting never waits for the API server (`audit.events.EventRecorder` queues them). Some notices are
one-offs per cause (a refused contract, a drift at one generation): `once()` remembers which were posted.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from corral.api.codes import API_VERSION
from corral.audit.events import EventRecorder, ObjectRef
from corral.reconcile.cache import Body, DeviceCache
from corral.reconcile.runtime import DeviceRuntime

Kind = Literal["Normal", "Warning"]


def device_ref(body: Body) -> ObjectRef:
    meta = body["metadata"]
    return ObjectRef(API_VERSION, "Device", meta["name"], meta.get("namespace"), meta.get("uid"))


def as_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


class DeviceNotices:
    def __init__(self, recorder: EventRecorder, devices: DeviceCache) -> None:
        self.recorder = recorder
        self.devices = devices

    def post(self, body: Body, reason: str, action: str, note: str, type_: Kind = "Normal") -> None:
        self.recorder.post(device_ref(body), reason, action, note, type_)

    def post_for(self, device_id: str, reason: str, action: str, note: str, type_: Kind = "Normal") -> None:
        """On the Device bound to device_id, if there is one."""
        bound = self.devices.bound(device_id)
        if bound:
            self.post(bound[0], reason, action, note, type_)

    def once(self, rt: DeviceRuntime, body: Body, key: str, reason: str, action: str, note: str,
             type_: Kind = "Normal") -> None:
        if key in rt.announced:
            return
        rt.announced.add(key)
        self.post(body, reason, action, note, type_)

    def state_changed(self, rt: DeviceRuntime, changed: dict[str, tuple[Any, Any]], cause: str,
                      body: Body | None = None) -> None:
        """A StateChanged Event with before, after and cause (nothing when this is the first state heard)."""
        if not changed or all(before is None for before, _ in changed.values()):
            return
        after = {k: v for k, (_, v) in changed.items()}
        before = {k: b for k, (b, _) in changed.items()}
        note = f"Reported state changed: {as_json(after)} (before: {as_json(before)}); cause: {cause}"
        if body is not None:
            self.post(body, "StateChanged", "Report", note)
        else:
            self.post_for(rt.device_id, "StateChanged", "Report", note)

"""Which device ids the Device controller's inputs queue: declared where the controller is wired, not in the reconciler.

As controller-runtime's builder declares `For(&Device{}, WithPredicates(GenerationChangedPredicate{}))` and
`Watches(...)` with handlers that map events to keys, this maps each watched change to the device ids to reconcile:

- a Device event passes the generation predicate: a new Device or a changed spec queues its device id (and the id
  it claimed before, if that changed); a change of only status, labels or annotations does not, and neither does
  the watch event of the controller's own write, whose answer the cache holds already. A Device its model refuses
  queues its device id, so that the reconciler says so on it; so does a Device whose location label is out of
  step with its overlay's location (someone changed or removed the label by hand): the reconciler puts it back;
- a namespace's Interlocks changed: every Device of the namespace (its status lists them; its targets are judged anew);
- a lease on a Device changed: that Device (a target held for the lease may be driven now).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from corral.api.device import Device
from corral.api.locations import location_out_of_step
from corral.kube.typed import Body
from corral.kube.workqueue import WorkQueue
from corral.reconcile.devices.cache import DeviceCache, DeviceChange, device_id_of


def queued_for(change: DeviceChange | None) -> list[str]:
    """The device ids a Device change queues (the generation predicate), the one it claims now first."""
    if change is None:
        return []  # an older copy
    if not change.generation_changed:
        # Only status, labels or annotations changed: nothing to drive, unless the location label left the overlay.
        after = change.after
        if after is not None and location_out_of_step(after.metadata.labels, _location(after)):
            return [after.spec.device_id]
        return []
    now = change.after.spec.device_id if change.after is not None else \
        change.refused.device_id if change.refused is not None else None
    before = change.before.spec.device_id if change.before is not None else None
    return [device_id for device_id in (now, before if before != now else None) if device_id]


def _location(device: Device) -> str | None:
    return device.spec.overlay.location if device.spec.overlay is not None else None


@dataclass(frozen=True)
class DeviceEvents:
    """The Device controller's inputs from Kubernetes, as the device ids they queue."""

    devices: DeviceCache
    queue: WorkQueue[str]
    adopt: Callable[[str], None]  # a Device now binds this id: take in what the device said before it was enrolled

    def on_device_event(self, event_type: str, body: Body) -> None:
        if event_type == "DELETED":
            device_id = device_id_of(self.devices.remove(body) or body)
            if device_id:
                self.queue.add(device_id)
            return
        change = self.devices.upsert(body)
        for index, device_id in enumerate(queued_for(change)):
            if index == 0 and change is not None and change.after is not None and change.generation_changed:
                self.adopt(device_id)  # it may have announced itself before it was enrolled
            self.queue.add(device_id)

    def on_interlocks_changed(self, namespace: str) -> None:
        for device in self.devices.devices():
            if device.metadata.namespace == namespace:
                self.queue.add(device.spec.device_id)

    def on_lease_changed(self, namespace: str, name: str) -> None:
        device = self.devices.device((namespace, name))
        if device is not None:
            self.queue.add(device.spec.device_id)

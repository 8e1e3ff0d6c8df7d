"""Which device ids a Device watch event queues (devices/wiring.py): kubebuilder's generation predicate, and the
device id a Device claimed before, when its deviceId moved."""

from __future__ import annotations

from typing import Any

from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.wiring import DeviceEvents


def device(version: str, generation: int, device_id: str = "lamp-1", **extra: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "home", "name": "lamp", "uid": "u1", "resourceVersion": version,
                         "generation": generation}, "spec": {"deviceId": device_id}, **extra}


def test_a_spec_change_queues_the_device_a_status_change_or_an_echo_does_not() -> None:
    queued: list[str] = []
    adopted: list[str] = []
    queue: Any = type("Queue", (), {"add": lambda self, key: queued.append(key)})()
    events = DeviceEvents(DeviceCache(), queue, adopt=adopted.append)
    events.on_device_event("ADDED", device("1", 1))
    events.on_device_event("MODIFIED", device("2", 1, status={"online": True}))
    events.on_device_event("MODIFIED", device("2", 1, status={"online": True}))
    assert queued == ["lamp-1"] and adopted == ["lamp-1"], "only the new Device: a status write is no spec change"
    events.on_device_event("MODIFIED", device("3", 2, device_id="lamp-2"))
    assert queued[1:] == ["lamp-2", "lamp-1"], "the id it claims now, and the one it let go"
    events.on_device_event("DELETED", device("4", 2, device_id="lamp-2"))
    assert queued[-1] == "lamp-2" and events.devices.claims("lamp-2") == []
    events.on_device_event("MODIFIED", device("5", 2, device_id="lamp-2"))
    events.on_lease_changed("home", "lamp")
    events.on_interlocks_changed("home")
    events.on_interlocks_changed("elsewhere")
    assert queued[-3:] == ["lamp-2", "lamp-2", "lamp-2"]

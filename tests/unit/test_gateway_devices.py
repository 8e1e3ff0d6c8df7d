"""The caller's Device watch (gateway/devices.py): bodies become Device models as they enter, a repeat is no
change, and a body the model refuses leaves the view without a crash."""

from __future__ import annotations

from typing import Any

import kubernetes

from corral.api.device import Device
from corral.gateway.devices import DeviceWatch, in_scope
from corral.kube.cache import Key
from corral.kube.client import AsyncApi


def body(name: str, version: str, **status: Any) -> dict[str, Any]:
    return {"apiVersion": "corral.dev/v1alpha1", "kind": "Device",
            "metadata": {"namespace": "home", "name": name, "uid": f"u-{name}", "resourceVersion": version},
            "spec": {"deviceId": name}, "status": status}


def watch() -> tuple[DeviceWatch, list[tuple[Key, Device | None, Device | None]]]:
    changes: list[tuple[Key, Device | None, Device | None]] = []
    api = AsyncApi(kubernetes.client.Configuration())  # never used: nothing here lists or watches
    return DeviceWatch(api, lambda key, before, after: changes.append((key, before, after)), lambda: "agent"), changes


def test_a_device_enters_as_its_model_and_a_repeat_of_the_same_version_is_no_change() -> None:
    devices, changes = watch()
    devices._event("ADDED", body("fan", "1", online=True))
    devices._event("MODIFIED", body("fan", "1", online=True))  # a list handing it over again
    assert len(changes) == 1
    key, before, after = changes[0]
    assert key == ("home", "fan") and before is None and after is not None and after.status is not None
    assert after.status.online is True and devices.bodies[key]["metadata"]["resourceVersion"] == "1"


def test_a_malformed_device_leaves_the_view_and_a_deleted_one_is_gone() -> None:
    devices, changes = watch()
    devices._event("ADDED", body("fan", "1"))
    devices._event("MODIFIED", {**body("fan", "2"), "spec": {"deviceId": "Not A Label"}})
    assert ("home", "fan") not in devices.devices and changes[-1][2] is None
    devices._event("ADDED", body("lamp", "3"))
    devices._event("DELETED", body("lamp", "4"))
    assert ("home", "lamp") not in devices.bodies and changes[-1][0] == ("home", "lamp") and changes[-1][2] is None


def test_a_scope_is_a_namespace_or_one_device() -> None:
    assert in_scope(("home", "fan"), "home") and in_scope(("home", "fan"), "home/fan")
    assert not in_scope(("home", "fan"), "home/lamp") and not in_scope(("garage", "fan"), "home")


def test_forgetting_a_scope_tells_each_of_its_devices_gone() -> None:
    devices, changes = watch()
    devices._event("ADDED", body("fan", "1"))
    devices._event("ADDED", body("lamp", "2"))
    devices._forget("home/fan")
    assert [key for key, _, after in changes if after is None] == [("home", "fan")]

"""A Device its model refuses is said so on it (an Event and the condition Ready=Malformed) and not driven, never a
crash; a status in a shape the model refuses counts as no status, as before models (it is written anew)."""

from __future__ import annotations

import asyncio
from typing import Any

from corral.kube.events import ObjectRef
from corral.reconcile.config import ControllerConfig
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.listening import Listening
from corral.reconcile.devices.reconciler import DeviceReconciler
from corral.reconcile.devices.runtime import Fleet
from corral.reconcile.devices.wiring import DeviceEvents, queued_for


def device(version: str, generation: int = 1, status: Any = None, **target: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "corral.dev/v1alpha1", "kind": "Device",
                            "metadata": {"namespace": "home", "name": "lamp", "uid": "u1", "resourceVersion": version,
                                         "generation": generation},
                            "spec": {"deviceId": "lamp-1", "target": target}}
    if status is not None:
        body["status"] = status
    return body


class Queue:
    def __init__(self) -> None:
        self.added: list[str] = []

    def add(self, key: str) -> None:
        self.added.append(key)


class Kube:
    def __init__(self) -> None:
        self.written: list[tuple[str, str, dict[str, Any], str]] = []

    async def apply_status(self, plural: str, namespace: str, name: str, kind: str, status: dict[str, Any],
                           reason: str) -> dict[str, Any]:
        self.written.append((namespace, name, status, reason))
        return device("99", status=status, power=[1, 2])


class Recorder:
    def __init__(self) -> None:
        self.posted: list[tuple[ObjectRef, str, str, str]] = []

    def post(self, regarding: ObjectRef, reason: str, action: str, note: str, type_: str = "Normal") -> None:
        self.posted.append((regarding, reason, note, type_))


def test_a_device_its_model_refuses_is_told_on_it_once_per_generation_and_not_driven() -> None:
    cache, queue = DeviceCache(), Queue()
    added: Any = queue
    events = DeviceEvents(cache, added, adopt=lambda device_id: None)
    events.on_device_event("ADDED", device("1", power=True))
    assert [d.spec.device_id for d in cache.claims("lamp-1")] == ["lamp-1"]
    events.on_device_event("MODIFIED", device("2", generation=2, power=[1, 2]))
    assert queue.added == ["lamp-1", "lamp-1"], "the refused Device is queued, to be told so"
    assert cache.claims("lamp-1") == [] and cache.device(("home", "lamp")) is None, "nothing acts on it"
    (refused,) = cache.refusals("lamp-1")
    assert "spec.target.power" in str(refused.error) and str(refused.error).startswith("Device home/lamp is malformed")

    kube, recorder = Kube(), Recorder()
    anything: Any = None
    api: Any = kube
    events_to: Any = recorder
    reconciler = DeviceReconciler(ControllerConfig(mqtt_url="mqtt://127.0.0.1:1883"), api, Fleet(), cache,
                                  anything, anything, events_to, Listening(lambda: True, lambda: 0.0), anything)
    result = asyncio.run(reconciler.reconcile("lamp-1"))
    assert result.requeue_after is None
    ((namespace, name, status, reason),) = kube.written
    assert (namespace, name, reason) == ("home", "lamp", "malformed")
    (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "Malformed")
    assert "spec.target.power" in ready["message"] and "not driven until it is mended" in ready["message"]
    ((ref, why, note, kind),) = recorder.posted
    assert (ref.name, why, kind) == ("lamp", "Malformed", "Warning") and "spec.target.power" in note

    asyncio.run(reconciler.reconcile("lamp-1"))
    assert len(kube.written) == 1 and len(recorder.posted) == 1, "told once per generation"
    events.on_device_event("MODIFIED", device("3", generation=3, power=False))
    assert [d.metadata.generation for d in cache.claims("lamp-1")] == [3] and cache.refusals("lamp-1") == []


def test_a_status_in_a_shape_the_model_refuses_counts_as_none() -> None:
    cache = DeviceCache()
    change = cache.upsert(device("1", status={"online": "maybe", "conditions": "none"}, power=True))
    assert change is not None and change.after is not None and change.after.status is None
    assert queued_for(change) == ["lamp-1"]
    assert cache.get(("home", "lamp")) is not None, "the body stays as it came, for those who pass it on"

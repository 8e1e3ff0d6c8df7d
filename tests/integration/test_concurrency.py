"""Concurrency against the real API server, broker and firmware: Intents that never undo each other, and an
event storm from another writer that the controller rides out.

Both tests judge the end state (the Device objects and the simulated hardware), never timing or counters.
"""

from __future__ import annotations

import functools
import random
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from corral.api.codes import FINAL_PHASES, GROUP, VERSION
from corral.client.intents import submit, wait_settled
from corral.devcluster.plane import Plane
from corral_sim.fleet import Fleet
from tests.controller_harness import ControllerProcess, device, devices
from tests.fleet_harness import hardware_applies, on_fleet, running_fleet
from tests.harness import api_client, grant, service_account_token, wait_for

pytestmark = pytest.mark.integration

ROUNDS = 20


@dataclass
class Lab:
    plane: Plane
    namespace: str
    fleet: Fleet
    admin: kubernetes.client.ApiClient
    operator_token: str
    requester: str

    def client(self) -> kubernetes.client.ApiClient:
        """A client of its own per thread, as separate agents would have."""
        return api_client(self.plane, token=self.operator_token)

    def hardware(self, device_id: str) -> dict[str, Any]:
        return on_fleet(self.fleet, lambda: self.fleet.devices[device_id].firmware.state())


@pytest.fixture
def lab(plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path,
        request: pytest.FixtureRequest) -> Iterator[Lab]:
    lights: list[str] = request.param
    grant(plane, corral_api, namespace, "operator", "[get, list, read, write]", "[get]", "write")
    token = service_account_token(corral_api, namespace, "operator")
    prefix = f"conc-{uuid.uuid4().hex[:6]}"
    with running_fleet(plane, prefix, dict.fromkeys(lights, "light"), enroll_in=(corral_api, namespace)) as fleet:
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log")
        controller.start()
        try:
            wait_for(lambda: all((device(corral_api, namespace, n).get("status") or {}).get("inSync") for n in lights),
                     "the lights registered and in sync", timeout_s=60)
            yield Lab(plane, namespace, fleet, corral_api, token, f"system:serviceaccount:{namespace}:operator")
        finally:
            controller.stop()


def intent(lab: Lab, device_name: str, actuator: str, action: str, value: Any) -> dict[str, Any]:
    return {"device": device_name, "actuator": actuator, "action": action, "params": {"value": value},
            "reason": "concurrency test", "requester": lab.requester}


def at_once(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls on threads of their own, released together."""
    start = threading.Barrier(len(calls))

    def released(call: Callable[[], Any]) -> Any:
        start.wait(10)
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(released, calls))


def ask_and_wait(lab: Lab, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    client = lab.client()
    assert submit(client, lab.namespace, name, spec).code == "CREATED"
    return wait_settled(client, lab.namespace, name, timeout_s=30)


@pytest.mark.parametrize("lab", [["desk-lamp"]], indirect=True)
def test_intents_on_three_actuators_of_one_device_all_created_at_once_never_undo_each_other(lab: Lab) -> None:
    asked: set[tuple[str, Any]] = set()
    for round_ in range(ROUNDS):
        wanted = {"power": round_ % 2 == 0, "brightness": 5 + 4 * round_, "color_temp": 2700 + 100 * round_}
        actions = {"power": "set_state", "brightness": "set_value", "color_temp": "set_value"}
        asked |= set(wanted.items())
        done = at_once([
            functools.partial(ask_and_wait, lab, f"r{round_:02d}-{actuator.replace('_', '-')}",
                              intent(lab, "desk-lamp", actuator, actions[actuator], value))
            for actuator, value in wanted.items()])
        assert [d["status"]["code"] for d in done] == ["EXECUTED"] * 3, [d["status"] for d in done]
        target = device(lab.admin, lab.namespace, "desk-lamp")["spec"]["target"]
        assert {a: target.get(a) for a in wanted} == wanted, f"round {round_}: an Intent was undone: {target}"
        state = lab.hardware("desk-lamp")
        assert {a: state[a] for a in wanted} == wanted, f"round {round_}: the hardware is at {state}"
    sent = set(hardware_applies(lab.fleet, "desk-lamp"))
    assert sent <= asked, f"commands for values no Intent asked for: {sorted(sent - asked, key=str)}"


LIGHTS = [f"storm-{i}" for i in range(6)]


@pytest.mark.parametrize("lab", [LIGHTS], indirect=True)
def test_an_event_storm_from_another_writer_ends_with_every_device_at_its_last_target(lab: Lab) -> None:
    """2,000 label and annotation patches and 200 target changes by a second client, while Intents run."""
    objects = lambda: kubernetes.client.CustomObjectsApi(api_client(lab.plane))  # noqa: E731 - one per thread
    rng = random.Random(7)
    last_brightness: dict[str, int] = {}
    lock = threading.Lock()

    def labels(worker: int) -> None:
        api = objects()
        for i in range(500):
            name = LIGHTS[(worker + i) % len(LIGHTS)]
            api.patch_namespaced_custom_object(GROUP, VERSION, lab.namespace, "devices", name, {"metadata": {
                "labels": {"storm": f"w{worker}-{i}"}, "annotations": {"storm.example/at": str(i)}}})

    def targets() -> None:
        api = objects()
        for _ in range(200):
            name, value = rng.choice(LIGHTS), rng.randrange(0, 101)
            api.patch_namespaced_custom_object(
                GROUP, VERSION, lab.namespace, "devices", name,
                {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Device", "metadata": {"name": name},
                 "spec": {"target": {"brightness": value}}},
                field_manager="storm", force=True, _content_type="application/apply-patch+yaml")
            with lock:
                last_brightness[name] = value

    def intents(worker: int) -> list[str]:
        codes = []
        for i in range(10):
            name = LIGHTS[(worker * 3 + i) % len(LIGHTS)]
            done = ask_and_wait(lab, f"storm-w{worker}-{i:02d}", intent(lab, name, "power", "set_state", i % 2 == 0))
            codes.append(done["status"]["code"])
        return codes

    results = at_once([lambda w=w: labels(w) for w in range(4)] + [targets]
                      + [lambda w=w: intents(w) for w in range(2)])
    codes = [code for result in results[5:] for code in result]
    assert codes == ["EXECUTED"] * 20

    def settled() -> dict[str, Any] | None:
        for body in devices(lab.admin, lab.namespace).values():
            status = body.get("status") or {}
            if status.get("observedGeneration") != body["metadata"]["generation"] or not status.get("inSync"):
                return None
        return devices(lab.admin, lab.namespace)

    final = wait_for(settled, "every Device observed at its generation and in sync", timeout_s=60)
    for name, body in final.items():
        target, state = body["spec"]["target"], lab.hardware(name)
        assert {a: state[a] for a in target} == target, f"{name}: hardware {state}, target {target}"
        if name in last_brightness:
            assert target["brightness"] == last_brightness[name], "the storm's last target is the one in force"
        assert body["metadata"]["labels"]["storm"].startswith("w"), "the labels went through too"
    phases = [(i.get("status") or {}).get("phase") for i in kubernetes.client.CustomObjectsApi(lab.admin)
              .list_namespaced_custom_object(GROUP, VERSION, lab.namespace, "intents")["items"]]
    assert all(p in FINAL_PHASES for p in phases)

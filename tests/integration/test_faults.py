"""Fault injection with real processes: the controller killed mid-burst, the broker and the API server
restarted, a device losing power mid-command, acks slower than the timeout. Each time: every Intent
reaches a final code, every target is reached, and the firmware executes each change exactly once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from corral.api.codes import FINAL_PHASES
from corral.client.install import install_api
from corral.client.intents import submit
from corral.devcluster.plane import APISERVER, BROKER, DevPlane, Plane
from corral_sim.fleet import Faults
from tests.controller_harness import ControllerProcess, device, events, set_target
from tests.fleet_harness import Watcher, hardware_applies, on_fleet, running_fleet
from tests.harness import api_client, grant, wait_for

pytestmark = pytest.mark.integration

def light_on(requester: str, name: str) -> dict[str, Any]:
    return {"device": name, "actuator": "power", "action": "set_state", "params": {"value": True},
            "reason": "fault test", "requester": requester}


def final(client: kubernetes.client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    intent = kubernetes.client.CustomObjectsApi(client).get_namespaced_custom_object(
        "corral.dev", "v1alpha1", namespace, "intents", name)
    return intent if (intent.get("status") or {}).get("phase") in FINAL_PHASES else None


def in_sync(client: kubernetes.client.ApiClient, namespace: str, names: list[str]) -> bool:
    return all((device(client, namespace, n).get("status") or {}).get("inSync") for n in names)


def test_a_controller_killed_with_20_intents_in_flight_finishes_each_once_after_restart(
        plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path) -> None:
    lamps = [f"lamp-{i:02d}" for i in range(20)]
    operator = grant(plane, corral_api, namespace, "operator", "[get, list, read, write]", "[get]", "write")
    requester = f"system:serviceaccount:{namespace}:operator"
    prefix = f"kill-{uuid.uuid4().hex[:6]}"
    objects = kubernetes.client.CustomObjectsApi(corral_api)
    # Acks take a while: a command can be on the device, executed, with its ack still on the way.
    with running_fleet(plane, prefix, dict.fromkeys(lamps, "light"), faults=Faults(ack_delay_ms=1500),
                       enroll_in=(corral_api, namespace)) as fleet:
        watcher = Watcher(plane, prefix)
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log")
        controller.start()
        try:
            wait_for(lambda: in_sync(corral_api, namespace, lamps), "the lamps registered", timeout_s=60)
            for i, lamp in enumerate(lamps):
                submit(operator, namespace, f"burst-{i:02d}", light_on(requester, lamp))

            def sent_not_acked() -> tuple[str, str] | None:
                for i in range(20):
                    status = objects.get_namespaced_custom_object(
                        "corral.dev", "v1alpha1", namespace, "intents", f"burst-{i:02d}").get("status") or {}
                    command = status.get("commandId")
                    if status.get("phase") != "Executing" or not command:
                        continue
                    sent = [m for m in watcher.messages(kind="cmd") if m.json().get("id") == command]
                    acked = [m for m in watcher.messages(kind="ack") if m.json().get("id") == command]
                    if sent and not acked:
                        return f"burst-{i:02d}", command
                return None

            caught, command = wait_for(sent_not_acked, "an Intent Executing with its command sent and no ack yet",
                                       timeout_s=20, interval_s=0.02)
            controller.kill()
            assert not [m for m in watcher.messages(kind="ack") if m.json().get("id") == command], \
                f"{caught}: its ack arrived before the kill"
            controller.start()
            done = wait_for(lambda: all(final(corral_api, namespace, f"burst-{i:02d}") for i in range(20))
                            and [final(corral_api, namespace, f"burst-{i:02d}") for i in range(20)],
                            "all 20 Intents final after the restart", timeout_s=60)
        finally:
            controller.stop()
            watcher.close()
        applied = {lamp: hardware_applies(fleet, lamp).count(("power", True)) for lamp in lamps}
    assert [d["status"]["code"] for d in done] == ["EXECUTED"] * 20
    assert applied == dict.fromkeys(lamps, 1), "each lamp switched exactly once"
    resumed = next(d for d in done if d["metadata"]["name"] == caught)
    assert resumed["status"]["commandId"] == command, "the restarted controller resent the same command id"


def test_acks_slower_than_the_timeout_are_retried_with_the_same_id_and_executed_once(
        plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path) -> None:
    prefix = f"slow-{uuid.uuid4().hex[:6]}"
    with running_fleet(plane, prefix, {"slow-fan": "env_fan"}, faults=Faults(ack_delay_ms=3000),
                       enroll_in=(corral_api, namespace)) as fleet:
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log", "--command-timeout", "1")
        controller.start()
        try:
            wait_for(lambda: device(corral_api, namespace, "slow-fan").get("status", {}).get("online"),
                     "the fan registered", timeout_s=60)
            set_target(corral_api, namespace, "slow-fan", {"fan": "high"})
            wait_for(lambda: in_sync(corral_api, namespace, ["slow-fan"]), "the fan at its target", timeout_s=60)
            timeouts = wait_for(lambda: [e for e in events(corral_api, namespace, "slow-fan")
                                         if e.reason == "CommandTimeout"], "a CommandTimeout Event")
        finally:
            controller.stop()
        applied = hardware_applies(fleet, "slow-fan").count(("fan", "high"))
    assert "will resend the same command id" in timeouts[0].note
    assert applied == 1, "resent commands carry the same id: the firmware runs the change once"


def test_a_device_losing_power_mid_command_ends_in_its_target_and_a_true_status(
        plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path) -> None:
    prefix = f"power-{uuid.uuid4().hex[:6]}"
    with running_fleet(plane, prefix, {"desk-lamp": "light"}, faults=Faults(ack_delay_ms=1500),
                       enroll_in=(corral_api, namespace)) as fleet:
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log")
        controller.start()
        try:
            wait_for(lambda: in_sync(corral_api, namespace, ["desk-lamp"]), "the lamp registered", timeout_s=60)
            applied_before = len(hardware_applies(fleet, "desk-lamp"))
            set_target(corral_api, namespace, "desk-lamp", {"power": True, "brightness": 70})
            # The first command has run on the device; its ack is held back for 1.5 s.
            wait_for(lambda: len(hardware_applies(fleet, "desk-lamp")) > applied_before, "a command to run on the lamp")
            on_fleet(fleet, lambda: fleet.power_cycle("desk-lamp", off_s=1.0))
            wait_for(lambda: in_sync(corral_api, namespace, ["desk-lamp"])
                     and device(corral_api, namespace, "desk-lamp")["status"]["reported"].get("brightness") == 70,
                     "the lamp back at its target after the power cut", timeout_s=60)
            hardware = on_fleet(fleet, lambda: fleet.devices["desk-lamp"].firmware.state())
        finally:
            controller.stop()
    assert hardware["power"] is True and hardware["brightness"] == 70, "the status tells the truth about the device"


@dataclass
class OwnPlane:
    dev: DevPlane
    plane: Plane
    admin: kubernetes.client.ApiClient


@pytest.fixture(scope="module")
def own_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnPlane]:
    """A plane of our own, whose broker and API server these tests stop and start."""
    dev = DevPlane(tmp_path_factory.mktemp("fault-plane"), progress=lambda line: None)
    plane = dev.up()
    admin = api_client(plane)
    install_api(admin)
    try:
        yield OwnPlane(dev, plane, admin)
    finally:
        dev.down(purge=True)


def _home(own: OwnPlane, name: str) -> tuple[str, kubernetes.client.ApiClient]:
    namespace = f"{name}-{uuid.uuid4().hex[:6]}"
    kubernetes.client.CoreV1Api(own.admin).create_namespace({"metadata": {"name": namespace}})
    operator = grant(own.plane, own.admin, namespace, "operator", "[get, list, read, write]", "[get]", "write")
    return namespace, operator


def test_after_a_broker_restart_pending_targets_are_driven_once(own_plane: OwnPlane, tmp_path: Path) -> None:
    plane, admin = own_plane.plane, own_plane.admin
    namespace, _ = _home(own_plane, "broker")
    lamps = ["porch", "hall", "study"]
    prefix = f"br-{uuid.uuid4().hex[:6]}"
    with running_fleet(plane, prefix, dict.fromkeys(lamps, "light"), enroll_in=(admin, namespace)) as fleet:
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log")
        controller.start()
        try:
            wait_for(lambda: in_sync(admin, namespace, lamps), "the lamps registered", timeout_s=60)
            own_plane.dev.down(only=BROKER)
            for lamp in lamps:  # decided while nobody can be told
                set_target(admin, namespace, lamp, {"power": True})
            time.sleep(1)
            own_plane.dev.up()
            wait_for(lambda: in_sync(admin, namespace, lamps)
                     and all(device(admin, namespace, n)["status"]["reported"]["power"] is True for n in lamps),
                     "the pending targets reached after the broker came back", timeout_s=60)
        finally:
            controller.stop()
        applied = {lamp: hardware_applies(fleet, lamp).count(("power", True)) for lamp in lamps}
    assert applied == dict.fromkeys(lamps, 1)


def test_after_an_api_server_restart_the_watches_resume_and_no_intent_is_missed(
        own_plane: OwnPlane, tmp_path: Path) -> None:
    plane, admin = own_plane.plane, own_plane.admin
    namespace, operator = _home(own_plane, "apiserver")
    requester = f"system:serviceaccount:{namespace}:operator"
    prefix = f"as-{uuid.uuid4().hex[:6]}"
    with running_fleet(plane, prefix, {"before": "light", "after": "light"}, enroll_in=(admin, namespace)) as fleet:
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log")
        controller.start()
        try:
            wait_for(lambda: in_sync(admin, namespace, ["before", "after"]), "the lamps registered", timeout_s=60)
            submit(operator, namespace, "just-before", light_on(requester, "before"))
            own_plane.dev.down(only=APISERVER)
            time.sleep(3)
            own_plane.dev.up()
            submit(operator, namespace, "just-after", light_on(requester, "after"))
            done = wait_for(lambda: (a := final(admin, namespace, "just-before")) and (b := final(admin, namespace, "just-after"))
                            and (a, b), "both Intents final after the restart", timeout_s=90)
        finally:
            controller.stop()
        applied = [hardware_applies(fleet, n).count(("power", True)) for n in ("before", "after")]
    assert [d["status"]["code"] for d in done] == ["EXECUTED", "EXECUTED"]
    assert applied == [1, 1]

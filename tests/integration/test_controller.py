"""The controller end to end: real kube-apiserver, real Mosquitto, real firmware, `corral run` as a process.

Each test has its own namespace and MQTT topic prefix, so devices, retained
messages and Devices of one test never meet another's. Executions are counted
on the simulated hardware, where "exactly once" matters.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.api.codes import GROUP, VERSION
from corral.client.enroll import enroll
from corral.contract.model import Contract
from corral.contract.signature import sign
from corral.devcluster.plane import Plane
from corral_sim.catalog import contract_for
from corral_sim.fleet import Faults
from corral_sim.presets import preset
from tests.controller_harness import (
    ControllerProcess,
    device,
    devices,
    events,
    running_controller,
    set_target,
    status_write_count,
)
from tests.fleet_harness import (
    THERMOMETER,
    announce,
    enroll_devices,
    hardware_applies,
    hardware_applies_at,
    on_fleet,
    played_thermometers,
    publish,
    running_fleet,
)
from tests.harness import kubectl, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def prefix() -> str:
    return f"ctl-{uuid.uuid4().hex[:8]}"


def reported(client: kubernetes.client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return (device(client, namespace, name).get("status") or {}).get("reported") or {}


def test_every_enrolled_device_of_the_home_preset_comes_online_and_identical_devices_share_a_capability(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, prefix: str, tmp_path: Path
) -> None:
    specs = preset("home")
    home = {spec.device_id: spec.device_type for spec in specs}
    with running_fleet(plane, prefix, home, telemetry_interval_s=5.0, enroll_in=(corral_api, namespace)), \
            running_controller(plane, namespace, prefix, tmp_path):
        listed = wait_for(
            lambda: (found := devices(corral_api, namespace)) and len(found) == len(home)
            and all((d.get("status") or {}).get("online") for d in found.values()) and found,
            f"all {len(home)} enrolled devices online", timeout_s=60,
        )
        assert set(listed) == set(home)
        capability_of = {name: d["status"]["capability"] for name, d in listed.items()}
        by_type: dict[str, set[str]] = {}
        for name, device_type in home.items():
            by_type.setdefault(device_type, set()).add(capability_of[name])
        assert all(len(names) == 1 for names in by_type.values()), by_type
        assert len(set(capability_of.values())) == len(by_type)
        objects = kubernetes.client.CustomObjectsApi(corral_api)
        for name in set(capability_of.values()):
            capability = objects.get_cluster_custom_object(GROUP, VERSION, "capabilities", name)
            assert name.endswith(capability["spec"]["contentHash"][:16])
        listed_by_kubectl = kubectl(plane, "get", "devices", "-n", namespace, "--no-headers").stdout.splitlines()
        online = [line for line in listed_by_kubectl if line.split()[1] == "true"]
        assert len(online) == len(home)


def test_a_new_target_reaches_the_device_once_even_if_the_controller_is_killed_before_the_ack(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, prefix: str, tmp_path: Path
) -> None:
    # Acks are held back 3 s (under the controller's 4 s command timeout), so the controller can be killed
    # after the device executed and before the controller heard about it.
    ack_delay_s = 3.0
    fleet_devices = {"desk-light": "light", "desk-fan": "env_fan"}
    with running_fleet(plane, prefix, fleet_devices, faults=Faults(ack_delay_ms=int(ack_delay_s * 1000)),
                       enroll_in=(corral_api, namespace)) as fleet:
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log")
        controller.start()
        try:
            wait_for(lambda: len(devices(corral_api, namespace)) == 2, "both devices registered", timeout_s=30)
            wait_for(lambda: reported(corral_api, namespace, "desk-fan"), "the fan's state known", timeout_s=30)
            before_light = len(hardware_applies(fleet, "desk-light"))
            before_fan = len(hardware_applies(fleet, "desk-fan"))

            set_target(corral_api, namespace, "desk-light", {"power": True, "brightness": 40})
            set_target(corral_api, namespace, "desk-fan", {"fan": "high"})
            # The fan executes as soon as the command arrives; its ack is still on the way. The Event is posted
            # off the loop, so it is waited for: a SIGKILL may lose an Event (the audit log has the command).
            executed_at = wait_for(lambda: next((at for a, v, at in hardware_applies_at(fleet, "desk-fan")
                                                 if (a, v) == ("fan", "high")), None), "the fan to execute",
                                   timeout_s=15)
            wait_for(lambda: "CommandSent" in [e.reason for e in events(corral_api, namespace, "desk-fan")],
                     "the CommandSent Event", timeout_s=ack_delay_s / 2)
            controller.kill()
            assert time.monotonic() < executed_at + ack_delay_s, "killed before the device's ack left it"
            controller.start()

            wait_for(lambda: reported(corral_api, namespace, "desk-fan").get("fan") == "high",
                     "the fan's reported state to reach high", timeout_s=40)
            wait_for(
                lambda: (r := reported(corral_api, namespace, "desk-light")).get("power") is True
                and r.get("brightness") == 40,
                "the light's reported state to reach its target", timeout_s=40,
            )
            light = device(corral_api, namespace, "desk-light")
            assert light["status"]["inSync"] is True
        finally:
            controller.stop()
        fan_applies = hardware_applies(fleet, "desk-fan")[before_fan:]
        light_applies = hardware_applies(fleet, "desk-light")[before_light:]
    assert fan_applies == [("fan", "high")], "the fan must execute its change exactly once"
    assert Counter(a for a, _ in light_applies) == {"power": 1, "brightness": 1}
    reasons = [e.reason for e in events(corral_api, namespace, "desk-fan")]
    assert "CommandSent" in reasons and "StateChanged" in reasons


def test_offline_shows_within_the_will_and_a_returning_device_gets_its_pending_target(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, prefix: str, tmp_path: Path
) -> None:
    with running_fleet(plane, prefix, {"porch-light": "light"}, enroll_in=(corral_api, namespace)) as fleet, \
            running_controller(plane, namespace, prefix, tmp_path):
        wait_for(lambda: (device(corral_api, namespace, "porch-light").get("status") or {}).get("online") is True,
                 "the light online", timeout_s=30)
        dropped_at = time.monotonic()
        on_fleet(fleet, lambda: fleet.drop_link("porch-light", down_s=6.0))
        wait_for(lambda: device(corral_api, namespace, "porch-light")["status"]["online"] is False,
                 "Online=False after the link dropped", timeout_s=10)
        seen_offline_after = time.monotonic() - dropped_at
        status = device(corral_api, namespace, "porch-light")["status"]
        assert status["stale"] is True

        set_target(corral_api, namespace, "porch-light", {"power": True})
        wait_for(
            lambda: any(c["reason"] == "DeviceOffline" for c in device(corral_api, namespace, "porch-light")["status"]
                        ["conditions"] if c["type"] == "InSync"),
            "InSync=False with reason DeviceOffline", timeout_s=10,
        )
        assert ("power", True) not in hardware_applies(fleet, "porch-light")
        wait_for(lambda: reported(corral_api, namespace, "porch-light").get("power") is True,
                 "the pending target applied after the device came back", timeout_s=30)
        assert hardware_applies(fleet, "porch-light").count(("power", True)) == 1
    assert seen_offline_after < 10


def test_a_contract_with_an_unknown_action_kind_is_refused_and_the_device_stays_inert(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, prefix: str, tmp_path: Path
) -> None:
    rogue = dict(contract_for("lock"))
    rogue["device_id"] = "back-door"
    rogue["actuators"] = [*rogue["actuators"], {"id": "all_doors", "name": "All doors", "type": "bool",
                                                "action": "unlock_everything", "risk": "low", "level": "write"}]
    announce(plane, prefix, "back-door", rogue)
    objects = kubernetes.client.CustomObjectsApi(corral_api)
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "devices", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Device", "metadata": {"name": "back-door"},
        "spec": {"deviceId": "back-door", "target": {"all_doors": True}},
    })
    with running_controller(plane, namespace, prefix, tmp_path):
        condition = wait_for(
            lambda: next((c for c in (device(corral_api, namespace, "back-door").get("status") or {}).get("conditions", [])
                          if c["type"] == "ContractValid" and c["status"] == "False"), None),
            "ContractValid=False", timeout_s=30,
        )
        assert "unlock_everything" in condition["message"]
        refused = wait_for(lambda: [e for e in events(corral_api, namespace, "back-door") if e.reason == "ContractRefused"],
                           "a ContractRefused Event", timeout_s=10)
        assert refused[0].type == "Warning"
        status = device(corral_api, namespace, "back-door")["status"]
        assert "capability" not in status and status["inSync"] is False


def test_a_changed_contract_is_recorded_with_its_diff(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, prefix: str, tmp_path: Path
) -> None:
    with running_fleet(plane, prefix, {"attic-fan": "env_fan"}, enroll_in=(corral_api, namespace)), \
            running_controller(plane, namespace, prefix, tmp_path):
        first = wait_for(lambda: (device(corral_api, namespace, "attic-fan").get("status") or {}).get("capability"),
                         "the first capability", timeout_s=30)
        upgraded = dict(contract_for("env_fan"))
        upgraded["device_id"] = "attic-fan"
        upgraded["fw"] = "1.3.0"
        announce(plane, prefix, "attic-fan", upgraded)
        changed = wait_for(lambda: [e for e in events(corral_api, namespace, "attic-fan") if e.reason == "ContractChanged"],
                           "a ContractChanged Event", timeout_s=20)
        assert "fw: 1.2.0 -> 1.3.0" in changed[0].note
        second = wait_for(
            lambda: (c := device(corral_api, namespace, "attic-fan")["status"].get("capability")) != first and c,
            "the Device to point at the new capability", timeout_s=20,
        )
        assert second != first


def test_status_writes_stay_within_budget_and_stop_when_nothing_changes(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, prefix: str, tmp_path: Path
) -> None:
    """200 devices at 1 Hz telemetry: fewer than 200 x (window / 10 s) status writes in the window.

    The premise is "no change beyond the deadband": the simulated RSSI and humidity wander
    further than 2% of their ranges, so the test sets deadbands above the simulator's noise.
    """
    fleet_devices = {f"probe-{i:03d}": "sht30" for i in range(200)}
    deadbands = ("--deadband", "rssi=20", "--deadband", "humidity=10")
    with running_fleet(plane, prefix, fleet_devices, telemetry_interval_s=1.0, connect_spread_s=2.0,
                       enroll_in=(corral_api, namespace)), \
            running_controller(plane, namespace, prefix, tmp_path, *deadbands):
        wait_for(lambda: len([d for d in devices(corral_api, namespace).values()
                              if (d.get("status") or {}).get("sensors")]) == 200,
                 "200 devices registered with sensors in status", timeout_s=120)
        window_s = 20.0
        before = status_write_count(plane)
        time.sleep(window_s)
        writes = status_write_count(plane) - before
    budget = 200 * window_s / 10
    print(f"status writes in {window_s:.0f}s with 200 devices at 1 Hz: {writes} (budget < {budget:.0f})")
    assert writes < budget


def test_no_status_writes_at_all_while_nothing_changes(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, prefix: str, tmp_path: Path
) -> None:
    """Devices keep sending telemetry at 1 Hz, always the same values: after the first write, silence."""
    ids = [f"still-{i}" for i in range(10)]
    reading = dict.fromkeys(ids, 21.5)
    with played_thermometers(plane, prefix, ids, lambda device_id, _second: reading[device_id],
                             enroll_in=(corral_api, namespace)), \
            running_controller(plane, namespace, prefix, tmp_path):
        wait_for(lambda: len([d for d in devices(corral_api, namespace).values()
                              if (d.get("status") or {}).get("sensors")]) == len(ids),
                 "every device's first sensor reading in status", timeout_s=30)
        time.sleep(2)  # let the last registrations settle
        before = status_write_count(plane)
        time.sleep(15)
        writes = status_write_count(plane) - before
        # The quiet was not deafness: one real change is written.
        reading[ids[0]] = 30.0
        wait_for(lambda: (device(corral_api, namespace, ids[0])["status"]["sensors"]["temperature"]["value"]
                          == 30.0), "the changed reading in status", timeout_s=15)
    assert writes == 0


def test_a_device_changed_by_hand_is_driven_back_under_enforce_and_left_alone_under_observe(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, prefix: str, tmp_path: Path
) -> None:
    with running_fleet(plane, prefix, {"hall-light": "light", "hall-fan": "env_fan"},
                       enroll_in=(corral_api, namespace)) as fleet, \
            running_controller(plane, namespace, prefix, tmp_path):
        wait_for(lambda: len(devices(corral_api, namespace)) == 2, "both devices registered", timeout_s=30)
        set_target(corral_api, namespace, "hall-light", {"power": True})
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Device", "metadata": {"name": "hall-fan"},
                "spec": {"deviceId": "hall-fan", "target": {"fan": "low"}, "drift": "Observe"}}
        kubernetes.client.CustomObjectsApi(corral_api).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "devices", "hall-fan", body,
            field_manager="kubectl", force=True, _content_type="application/apply-patch+yaml",
        )
        for name, key, value in (("hall-light", "power", True), ("hall-fan", "fan", "low")):
            wait_for(lambda name=name, key=key, value=value: reported(corral_api, namespace, name).get(key) == value,
                     f"{name} at its target", timeout_s=20)

        # Someone flips both at the devices themselves.
        on_fleet(fleet, lambda: fleet.set_locally("hall-light", "power", False))
        on_fleet(fleet, lambda: fleet.set_locally("hall-fan", "fan", "high"))

        wait_for(lambda: hardware_applies(fleet, "hall-light")[-1] == ("power", True),
                 "the light driven back to its target", timeout_s=20)
        assert hardware_applies(fleet, "hall-light").count(("power", True)) == 2  # the drive and the re-drive
        wait_for(lambda: reported(corral_api, namespace, "hall-light").get("power") is True,
                 "the light's status back in sync", timeout_s=20)
        assert device(corral_api, namespace, "hall-light")["status"]["commandEpoch"] == 1

        fan = wait_for(
            lambda: (s := device(corral_api, namespace, "hall-fan")["status"])["inSync"] is False
            and s["reported"]["fan"] == "high" and s,
            "the fan's drift recorded", timeout_s=20,
        )
        in_sync = next(c for c in fan["conditions"] if c["type"] == "InSync")
        assert in_sync["reason"] == "Drifted"
        assert hardware_applies(fleet, "hall-fan")[-1] == ("fan", "high")  # left alone
        for name in ("hall-light", "hall-fan"):
            drift_events = wait_for(lambda name=name: [e for e in events(corral_api, namespace, name) if e.reason == "Drift"],
                                    f"the Drift Event of {name}")
            assert drift_events[0].type == "Warning"


def test_a_device_made_by_a_person_binds_when_its_device_appears(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, prefix: str, tmp_path: Path
) -> None:
    objects = kubernetes.client.CustomObjectsApi(corral_api)
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "devices", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Device", "metadata": {"name": "reading-lamp"},
        "spec": {"deviceId": "lamp-7f3a", "target": {"power": True}, "overlay": {"alias": "reading lamp"}},
    })
    with running_controller(plane, namespace, prefix, tmp_path) as controller:
        waiting = wait_for(lambda: (device(corral_api, namespace, "reading-lamp").get("status") or {}).get("conditions"),
                           "a waiting status", timeout_s=20)
        assert any(c["reason"] == "WaitingForDevice" for c in waiting)
        credential = enroll(corral_api, namespace, "reading-lamp", "light", device_id="lamp-7f3a")
        with running_fleet(plane, prefix, {"lamp-7f3a": "light"}, credentials={"lamp-7f3a": credential.password}) \
                as fleet:
            wait_for(lambda: reported(corral_api, namespace, "reading-lamp").get("power") is True,
                     "the person's Device bound and its target applied", timeout_s=30)
            assert ("power", True) in hardware_applies(fleet, "lamp-7f3a")
            # A restart hears the retained info at once; it must still know the lamp is bound.
            assert controller.stop() == 0, "SIGTERM must stop the controller cleanly"
            controller.start()
            time.sleep(3)
        assert set(devices(corral_api, namespace)) == {"reading-lamp"}  # the controller never makes a Device of its own


def test_a_second_device_claiming_the_same_device_id_is_refused_and_told_why(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, prefix: str, tmp_path: Path
) -> None:
    objects = kubernetes.client.CustomObjectsApi(corral_api)
    for name in ("garage-door", "garage-door-copy"):
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "devices", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Device", "metadata": {"name": name},
            "spec": {"deviceId": "garage-lock"},
        })
        time.sleep(1.1)  # creation timestamps have one-second resolution
    credential = enroll(corral_api, namespace, "garage-door", "lock", device_id="garage-lock")
    with running_fleet(plane, prefix, {"garage-lock": "lock"}, credentials={"garage-lock": credential.password}), \
            running_controller(plane, namespace, prefix, tmp_path):
        wait_for(lambda: (device(corral_api, namespace, "garage-door").get("status") or {}).get("online"),
                 "the first Device bound", timeout_s=30)
        bound = wait_for(
            lambda: next((c for c in (device(corral_api, namespace, "garage-door-copy").get("status") or {})
                          .get("conditions", []) if c["type"] == "Bound"), None),
            "the second Device told it is not bound", timeout_s=20,
        )
        assert bound["status"] == "False" and bound["reason"] == "DuplicateDeviceId"
        assert f"already bound to Device {namespace}/garage-door" in bound["message"]
        reasons = wait_for(lambda: [e.reason for e in events(corral_api, namespace, "garage-door-copy")],
                           "the DuplicateDeviceId Event")
        assert reasons == ["DuplicateDeviceId"]


def test_with_signatures_required_only_contracts_signed_by_a_trusted_key_are_accepted(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, prefix: str, tmp_path: Path
) -> None:
    factory = Ed25519PrivateKey.generate()
    public = factory.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    kubernetes.client.CoreV1Api(corral_api).create_namespaced_secret(namespace, {
        "metadata": {"name": "contract-keys"}, "data": {"factory": base64.b64encode(public).decode()},
    })
    stranger = Ed25519PrivateKey.generate()
    enroll_devices(corral_api, namespace, dict.fromkeys(("signed-plug", "unsigned-plug", "forged-plug"), "relay"))
    for device_id, key in (("signed-plug", factory), ("unsigned-plug", None), ("forged-plug", stranger)):
        info = {**contract_for("relay"), "device_id": device_id}
        if key is not None:
            info["signature"] = sign(Contract.model_validate(info), key)
        announce(plane, prefix, device_id, info)
    with running_controller(plane, namespace, prefix, tmp_path,
                            "--require-signatures", "--signing-keys", f"{namespace}/contract-keys"):
        wait_for(lambda: (device(corral_api, namespace, "signed-plug").get("status") or {}).get("capability"),
                 "the signed contract accepted", timeout_s=30)
        for device_id, why in (("unsigned-plug", "contract signature unsigned"),
                               ("forged-plug", "matches no trusted key (trusted: factory)")):
            refused = wait_for(
                lambda device_id=device_id: next(
                    (c for c in (device(corral_api, namespace, device_id).get("status") or {}).get("conditions", [])
                     if c["type"] == "ContractValid" and c["status"] == "False"), None),
                f"{device_id} refused", timeout_s=20,
            )
            assert why in refused["message"]
            assert "capability" not in device(corral_api, namespace, device_id)["status"]


def test_a_status_that_arrives_before_the_contract_is_kept_and_applied_when_the_contract_comes(
    plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, prefix: str, tmp_path: Path
) -> None:
    """MQTT orders messages per topic only: a device may say `online` before its `info` reaches us."""
    info = {**THERMOMETER, "device_id": "early-bird"}
    enroll_devices(corral_api, namespace, {"early-bird": "thermometer"})
    with running_controller(plane, namespace, prefix, tmp_path):
        # Not retained, so said once; acknowledged by the broker before the contract is published.
        publish(plane, [(f"{prefix}/early-bird/status", "online", False)])
        publish(plane, [(f"{prefix}/early-bird/info", json.dumps(info), True)])
        status = wait_for(lambda: (device(corral_api, namespace, "early-bird").get("status") or {}).get("capability")
                          and device(corral_api, namespace, "early-bird")["status"],
                          "the device registered with its contract", timeout_s=20)
    assert status["online"] is True, "the status said before the contract was not lost"

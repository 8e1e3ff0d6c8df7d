"""A device's presence and history as people see them: real firmware, the real broker and API server, `corral run`.

A device the broker throws off by administrative action (its account disabled, deleted or changed, by
`corral devices revoke` and `rotate`, or by an administrator's `mosquitto_ctrl`) sends no Last Will, so its
retained status keeps saying `online`. The controller takes it offline from the broker's answer to its own
account change, and from the broker's log for anyone else's (`corral run --broker-log`). And what happens to a
Device shows on the Device itself: `kubectl describe device` lists the Events regarding it.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes
import pytest

from corral.api.codes import FINAL_PHASES, GROUP, VERSION
from corral.client.enroll import enroll
from corral.client.intents import decide_on, submit
from corral.devcluster.plane import Plane
from corral_sim.catalog import contract_for
from tests.broker_harness import dynsec
from tests.controller_harness import CORRAL, ControllerProcess, device, events
from tests.fleet_harness import running_fleet
from tests.harness import fresh_namespace, grant, kubectl, wait_for
from tests.mqtt5_harness import Account, PlayedDevice, logs_in

pytestmark = pytest.mark.integration

LOCK, PORCH, SPARE = "front-door-lock", "porch-light", "spare-light"
MUTE = "mute-lamp"  # played: it takes commands and never acks them
OFFLINE_WITHIN_S = 5.0


@dataclass
class House:
    plane: Plane
    admin: kubernetes.client.ApiClient
    operator: kubernetes.client.ApiClient
    parent: kubernetes.client.ApiClient
    namespace: str
    controller: ControllerProcess
    prefix: str
    mute: PlayedDevice

    def status(self, name: str) -> dict[str, Any]:
        return device(self.admin, self.namespace, name).get("status") or {}

    def ask(self, name: str, actuator: str, value: Any) -> str:
        intent = f"req-{uuid.uuid4().hex[:8]}"
        spec = {"device": name, "actuator": actuator, "action": "set_state", "params": {"value": value},
                "reason": "presence test", "requester": f"system:serviceaccount:{self.namespace}:operator"}
        assert submit(self.operator, self.namespace, intent, spec).code == "CREATED"
        return intent

    def intent(self, name: str) -> dict[str, Any]:
        """The Intent's status now."""
        return kubernetes.client.CustomObjectsApi(self.admin).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "intents", name).get("status") or {}

    def outcome(self, intent: str, timeout_s: float = 20) -> dict[str, Any]:
        return wait_for(lambda: (s := self.intent(intent)).get("phase") in FINAL_PHASES and s, f"Intent {intent} to end",
                        timeout_s=timeout_s)


@pytest.fixture(scope="module")
def house(plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[House]:
    logs = tmp_path_factory.mktemp("presence")
    prefix = f"prs-{uuid.uuid4().hex[:8]}"
    with fresh_namespace(corral_api, "presence") as namespace:
        operator = grant(plane, corral_api, namespace, "operator", "[get, list, read, write]", "[get]", "write")
        parent = grant(plane, corral_api, namespace, "parent", "[get, list, read, approve]", "[get, list, create]",
                       "approve", person=True)
        with running_fleet(plane, prefix, {LOCK: "lock", PORCH: "light", SPARE: "light"},
                           enroll_in=(corral_api, namespace)):
            mute_password = enroll(corral_api, namespace, MUTE, "light").password
            # A long Intent window: an Intent that ends within seconds did not end by TIMEOUT.
            controller = ControllerProcess(plane, namespace, prefix, logs / "controller.log",
                                           "--broker-log", str(plane.broker_log), "--intent-timeout", "60")
            controller.start()
            mute = PlayedDevice(plane.mqtt_port, prefix, MUTE, mute_password, contract_for("light"),
                                {"power": False, "brightness": 0})
            try:
                wait_for(lambda: logs_in(plane.mqtt_port, Account(MUTE, mute_password)), "the mute lamp's account")
                mute.start()
                house = House(plane, corral_api, operator, parent, namespace, controller, prefix, mute)
                wait_for(lambda: all(house.status(d).get("inSync") and house.status(d).get("online")
                                     for d in (LOCK, PORCH, SPARE, MUTE)), f"the house online (logs in {logs})",
                         timeout_s=45)
                yield house
            finally:
                mute.close()
                controller.stop()


def test_a_revoked_device_is_offline_within_seconds_and_an_intent_to_it_ends_device_gone(house: House) -> None:
    invoked = time.monotonic()
    revoked = subprocess.run([CORRAL, "devices", "revoke", SPARE, "-n", house.namespace, "--kubeconfig",
                              str(house.plane.kubeconfig)], capture_output=True, text=True, timeout=60)
    assert revoked.returncode == 0, revoked.stderr
    returned = time.monotonic()
    wait_for(lambda: house.status(SPARE).get("online") is False, "the revoked device offline in status",
             timeout_s=OFFLINE_WITHIN_S)
    print(f"revoked device offline in status {time.monotonic() - invoked:.2f} s after corral devices revoke started "
          f"({returned - invoked:.2f} s of it the command itself)")
    gone = house.outcome(house.ask(SPARE, "power", True))
    assert gone["code"] == "DEVICE_GONE" and "offline" in gone["message"], gone
    note = next(e.note for e in events(house.admin, house.namespace, SPARE) if e.reason == "Offline")
    assert "revoked" in note, note

    # The positive control: a device nobody revoked stays online and executes.
    assert house.status(PORCH).get("online") is True
    done = house.outcome(house.ask(PORCH, "power", not house.status(PORCH)["reported"]["power"]))
    assert done["code"] == "EXECUTED", done


def test_an_intent_waiting_for_the_ack_of_a_device_that_is_revoked_ends_device_gone_at_once(house: House) -> None:
    house.mute.mqtt.client.on_message = lambda *_: None  # commands arrive, no ack ever leaves
    intent = house.ask(MUTE, "power", True)
    wait_for(lambda: house.intent(intent).get("phase") == "Executing", "the Intent sent and waiting for its ack")
    revoked = subprocess.run([CORRAL, "devices", "revoke", MUTE, "-n", house.namespace, "--kubeconfig",
                              str(house.plane.kubeconfig)], capture_output=True, text=True, timeout=60)
    assert revoked.returncode == 0, revoked.stderr
    gone = house.outcome(intent, timeout_s=10)  # its window is 60 s: ending now is not a TIMEOUT
    assert gone["code"] == "DEVICE_GONE" and "revoked" in gone["message"], gone


def test_a_device_an_administrator_kicks_is_offline_and_online_again_once_it_is_back(house: House) -> None:
    """Someone else's kick (here the broker admin's, as `mosquitto_ctrl dynsec disableClient` sends it): only the
    broker's log tells it. Its re-enabled account lets the firmware back in, and the status follows."""
    assert house.status(PORCH).get("online") is True
    dynsec(house.plane, [{"command": "disableClient", "username": PORCH}])
    try:
        started = time.monotonic()
        wait_for(lambda: house.status(PORCH).get("online") is False, "the kicked device offline in status",
                 timeout_s=OFFLINE_WITHIN_S)
        print(f"kicked device offline in status {time.monotonic() - started:.2f} s after the kick")
    finally:
        dynsec(house.plane, [{"command": "enableClient", "username": PORCH}])
    wait_for(lambda: house.status(PORCH).get("online") is True, "the device online again once it reconnected",
             timeout_s=15)
    told = [(e.reason, e.note) for e in events(house.admin, house.namespace, PORCH) if e.reason in ("Offline", "Online")]
    assert [reason for reason, _ in told][-2:] == ["Offline", "Online"], told
    assert "the broker logged" in told[-2][1] and PORCH in told[-2][1], told
    done = house.outcome(house.ask(PORCH, "power", not house.status(PORCH)["reported"]["power"]))
    assert done["code"] == "EXECUTED", done


def test_a_rotated_device_is_offline_until_it_has_its_new_password(house: House) -> None:
    """corral devices rotate changes the broker account, which throws the device off; the firmware tries again with
    the password it has. The status follows: offline while the old one is refused, online once it has the new."""
    assert house.status(PORCH).get("online") is True
    rotated = subprocess.run([CORRAL, "devices", "rotate", PORCH, "-n", house.namespace, "--kubeconfig",
                              str(house.plane.kubeconfig)], capture_output=True, text=True, timeout=60)
    assert rotated.returncode == 0, rotated.stderr
    new = next(line.split()[-1] for line in rotated.stdout.splitlines() if line.startswith("password"))
    wait_for(lambda: house.status(PORCH).get("online") is False, "the rotated device offline in status",
             timeout_s=OFFLINE_WITHIN_S)
    note = [e.note for e in events(house.admin, house.namespace, PORCH) if e.reason == "Offline"][-1]
    assert "new password" in note, note
    # The positive control: the device with its new password (played here: the simulator keeps the one it was
    # started with) is let in, says online, and the status follows.
    played = PlayedDevice(house.plane.mqtt_port, house.prefix, PORCH, new, contract_for("light"),
                          {"power": False, "brightness": 0}).start()
    try:
        wait_for(lambda: house.status(PORCH).get("online") is True, "the device online with its new password",
                 timeout_s=10)
    finally:
        played.close()


def test_kubectl_describe_device_tells_what_an_intent_did_to_the_lock(house: House) -> None:
    locked = house.status(LOCK)["reported"]["locked"]
    intent = house.ask(LOCK, "locked", not locked)
    wait_for(lambda: house.intent(intent).get("phase") == "AwaitingApproval", "the lock's Intent to wait for a person")
    decide_on(house.parent, house.namespace, intent, "Approve", "the door, as asked")
    done = house.outcome(intent)
    assert done["code"] == "EXECUTED", done

    def described() -> str | None:
        shown = kubectl(house.plane, "describe", "device", LOCK, "-n", house.namespace).stdout
        return shown if "StateChanged" in shown and intent in shown else None
    shown = wait_for(described, "kubectl describe device to show the Intent's change", timeout_s=10)
    events_part = shown.split("Events:", 1)[1]
    assert "<none>" not in events_part.splitlines()[0], shown
    assert f'"locked": {str(not locked).lower()}' in events_part, events_part

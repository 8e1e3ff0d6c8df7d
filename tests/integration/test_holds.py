"""Timed holds end to end: real API server, real broker, real controller (killed once), simulated hardware.

An Intent with `holdFor` puts the value from before back when the hold runs out, as a new decision in the
requester's name that is in the audit log; it survives a controller killed in the middle; a person's change in
between cancels it; a heater that requires a hold is refused without one; and a heater held on by an agent goes
back off even though agents were paused after it ran and a person holds the heater's lease.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kubernetes
import pytest

from corral.api.codes import API_VERSION, FINAL_PHASES, GROUP, VERSION
from corral.audit.log import read_records
from corral.client.intents import decide_on, submit, wait_settled
from corral.devcluster.plane import Plane
from tests.controller_harness import ControllerProcess, device, events, set_target
from tests.fleet_harness import hardware_applies, running_fleet
from tests.harness import bind_approver, fresh_namespace, grant, person_name, person_user, wait_for

pytestmark = pytest.mark.integration

LIGHT, HEATER = "hall-light", "den-heater"


@dataclass
class Hall:
    namespace: str
    fleet: Any
    admin: kubernetes.client.ApiClient
    agent: kubernetes.client.ApiClient
    person: kubernetes.client.ApiClient
    controller: ControllerProcess

    @property
    def agent_user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:agent"

    @property
    def person_user(self) -> str:
        return person_user(self.namespace, "parent")

    def ask(self, device_name: str, actuator: str, action: str, value: Any, *, person: bool = False,
            **extra: Any) -> dict[str, Any]:
        """An Intent, once it is final or waits for a person."""
        name = f"hold-{uuid.uuid4().hex[:8]}"
        spec = {"device": device_name, "actuator": actuator, "action": action, "reason": "test",
                "requester": self.person_user if person else self.agent_user, **extra}
        if value is not None:
            spec["params"] = {"value": value}
        assert submit(self.person if person else self.agent, self.namespace, name, spec).code == "CREATED"
        return wait_settled(self.admin, self.namespace, name, 20)

    def applies_tail(self, device_name: str, count: int) -> list[tuple[str, Any]]:
        """What the simulated hardware of the device was told last (actuator, value), oldest first."""
        return hardware_applies(self.fleet, device_name)[-count:]

    def intent(self, name: str) -> dict[str, Any]:
        return kubernetes.client.CustomObjectsApi(self.admin).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "intents", name)

    def hold_ended(self, name: str, timeout_s: float = 15) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            hold = (self.intent(name).get("status") or {}).get("hold") or {}
            return hold if hold.get("state") not in (None, "Pending") else None
        found = wait_for(ended, f"the hold of Intent {name} to end", timeout_s=timeout_s)
        assert found is not None
        return found

    def records(self, uid: str, kind: str) -> list[Any]:
        return [r for r in read_records(self.controller.audit_dir) if r.uid == uid and r.kind == kind]


@pytest.fixture(scope="module")
def hall(plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Hall]:
    logs = tmp_path_factory.mktemp("holds")
    prefix = f"hld-{uuid.uuid4().hex[:8]}"
    with fresh_namespace(corral_api, "holds") as namespace:
        agent = grant(plane, corral_api, namespace, "agent", "[get, list, read, write]", "[get]", "write")
        person = grant(plane, corral_api, namespace, "parent", "[get, list, read, write, approve]",
                       "[get, list, create]", "approve", person=True)
        # The chart's approver role: the person may pause agents.
        bind_approver(corral_api, namespace, person_name(namespace, "parent"))
        with running_fleet(plane, prefix, {LIGHT: "light", HEATER: "space_heater"},
                           enroll_in=(corral_api, namespace)) as fleet:
            controller = ControllerProcess(plane, namespace, prefix, logs / "controller.log", "--approval-window", "60")
            controller.start()
            try:
                wait_for(lambda: all((s := device(corral_api, namespace, d).get("status") or {}).get("inSync")
                                     and s.get("reported") for d in (LIGHT, HEATER)),
                         "the light and the heater registered and reporting", timeout_s=30)
                yield Hall(namespace, fleet, corral_api, agent, person, controller)
            finally:
                controller.stop()


def test_a_light_held_on_for_3s_goes_back_off_as_a_new_decision_in_the_requesters_name(hall: Hall) -> None:
    intent = hall.ask(LIGHT, "power", "set_state", True, holdFor="3s")
    executed_seen = time.monotonic()
    status = intent["status"]
    assert status["code"] == "EXECUTED", status
    hold = status["hold"]
    assert hold["state"] == "Pending" and hold["revertTo"] is False, hold
    assert "Holding power=true for 3 s" in status["message"]
    decided = datetime.fromisoformat(status["decidedAt"])
    until = datetime.fromisoformat(hold["until"])
    assert 2 <= (until - decided).total_seconds() <= 4
    ended = hall.hold_ended(intent["metadata"]["name"])
    assert ended["state"] == "Reverted", ended
    assert datetime.now(UTC) >= until and "Put back power=false" in ended["message"]
    print(f"\n[figure] hold of 3 s: Reverted (device ack) seen {time.monotonic() - executed_seen:.2f} s after EXECUTED was")
    assert hall.applies_tail(LIGHT, 2) == [("power", True), ("power", False)]
    assert device(hall.admin, hall.namespace, LIGHT)["spec"]["target"]["power"] is False
    uid = intent["metadata"]["uid"]
    decision = hall.records(uid, "intent.decided")
    assert decision and decision[-1].data["hold"]["state"] == "Pending"
    reverted = hall.records(uid, "intent.reverted")
    assert [(r.data["state"], r.data["value"], r.data["requester"]) for r in reverted] == [
        ("Reverted", False, hall.agent_user)]
    assert ended["audit"]["seq"] == reverted[0].seq
    assert hall.records(uid, "intent.reverting"), "the revert was decided on record before it was applied"
    assert any(e.reason == "HoldReverted" for e in events(hall.admin, hall.namespace, intent["metadata"]["name"]))


def test_a_hold_survives_a_controller_killed_in_the_middle(hall: Hall) -> None:
    intent = hall.ask(LIGHT, "power", "set_state", True, holdFor="4s")
    name = intent["metadata"]["name"]
    assert intent["status"]["code"] == "EXECUTED"
    hall.controller.kill()
    # Killed while the hold was Pending: nothing else writes the Intent's status.
    at_kill = hall.intent(name)["status"]["hold"]
    assert at_kill["state"] == "Pending" and datetime.now(UTC) < datetime.fromisoformat(at_kill["until"]), at_kill
    hall.controller.start()
    ended = hall.hold_ended(name, timeout_s=20)
    assert ended["state"] == "Reverted", ended
    assert hall.applies_tail(LIGHT, 2) == [("power", True), ("power", False)]


def test_a_persons_change_in_between_cancels_the_revert_and_says_so(hall: Hall) -> None:
    intent = hall.ask(LIGHT, "brightness", "set_value", 80, holdFor="3s")
    name = intent["metadata"]["name"]
    assert intent["status"]["code"] == "EXECUTED" and intent["status"]["hold"]["state"] == "Pending"
    set_target(hall.admin, hall.namespace, LIGHT, {"brightness": 30})  # kubectl apply, another field manager
    wait_for(lambda: ("brightness", 30) in hall.applies_tail(LIGHT, 1), "the person's brightness driven")
    ended = hall.hold_ended(name)
    assert ended["state"] == "Cancelled", ended
    assert "spec.target.brightness changed to 30 (by field manager kubectl)" in ended["message"]
    assert hall.applies_tail(LIGHT, 1) == [("brightness", 30)], "nothing was put back over the person's setting"
    assert device(hall.admin, hall.namespace, LIGHT)["spec"]["target"]["brightness"] == 30
    assert [r.data["state"] for r in hall.records(intent["metadata"]["uid"], "intent.reverted")] == ["Cancelled"]


def test_switching_a_heater_on_without_the_required_hold_is_refused_naming_the_limit(hall: Hall) -> None:
    before = len(hardware_applies(hall.fleet, HEATER))
    refused = hall.ask(HEATER, "power", "set_level", "low")["status"]
    assert refused["code"] == "DENY_ARGUMENTS", refused
    assert "requires a hold (holdFor) of at most 7200 s" in refused["message"]
    assert "its hardware may stay on at most 7200 s" in refused["message"]
    too_long = hall.ask(HEATER, "power", "set_level", "low", holdFor="3h")["status"]
    assert too_long["code"] == "DENY_ARGUMENTS" and "at most 7200 s" in too_long["message"], too_long
    assert len(hardware_applies(hall.fleet, HEATER)) == before


def test_a_heater_held_on_by_an_agent_goes_back_off_despite_the_pause_and_a_persons_lease(hall: Hall) -> None:
    waiting = hall.ask(HEATER, "power", "set_level", "high", holdFor="3s")
    name = waiting["metadata"]["name"]
    assert waiting["status"]["phase"] == "AwaitingApproval", waiting["status"]  # high risk: a person approves
    decide_on(hall.person, hall.namespace, name, "Approve", "warm the den for a moment")
    def final() -> dict[str, Any] | None:
        status: dict[str, Any] = hall.intent(name).get("status") or {}
        return status if status.get("phase") in FINAL_PHASES else None
    executed = wait_for(final, "the approved heater Intent to run")
    assert executed is not None
    assert executed["code"] == "EXECUTED" and executed["hold"]["revertTo"] == "off", executed
    pause = {"apiVersion": API_VERSION, "kind": "AgentPause", "metadata": {"name": "agents"},
             "spec": {"paused": True, "reason": "leaving the house", "by": hall.person_user,
                      "since": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}}
    objects = kubernetes.client.CustomObjectsApi(hall.person)
    objects.create_namespaced_custom_object(GROUP, VERSION, hall.namespace, "agentpauses", pause)
    try:
        lease = hall.ask(HEATER, "lease", "acquire", 600, person=True)["status"]
        assert lease["code"] == "EXECUTED", lease
        # Both are in force for the agent now: its next request is stopped.
        assert hall.ask(HEATER, "power", "set_level", "off")["status"]["code"] == "DENY_PAUSED"
        assert (hall.intent(name)["status"]["hold"]["state"]) == "Pending"
        ended = hall.hold_ended(name)
        assert ended["state"] == "Reverted", ended
        assert hall.applies_tail(HEATER, 2) == [("power", "high"), ("power", "off")]
        reverted = hall.records(waiting["metadata"]["uid"], "intent.reverted")
        assert [(r.data["state"], r.data["requester"]) for r in reverted] == [("Reverted", hall.agent_user)]
    finally:  # the module's other tests act as the agent, and on a heater nobody holds
        objects.delete_namespaced_custom_object(GROUP, VERSION, hall.namespace, "agentpauses", "agents")
        hall.ask(HEATER, "lease", "release", None, person=True)

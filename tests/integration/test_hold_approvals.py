"""A timed hold's `then` is decided, approved, shown and hashed with the main value (issue 41, finding 2).

The attack, replayed: an agent creates at the API server `locked=true, holdFor, then: false` on a door lock.
Before, a person's approval of "locked = true" (all the page and `corral intents` showed), or a grant for
`locked: [true]`, let it run, and the door unlocked when the hold ran out even if agents were paused. Now the
grant does not cover it and the approval of "locked = true" alone does not count; `corral intents`, `corral
approve` and the MCP answers name what the hold puts back; a replay with another `then` is DENY_ID_CONFLICT; and
an Intent decided before `then` was bound (its status.paramsHash leaves `then` out) does not unlock the door
at the end of its hold, while a `then` a person did approve is put back even with agents paused.

Real API server, real broker (with auth), real controller and gateway processes, simulated locks.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from corral.api.codes import API_VERSION, FINAL_PHASES, GROUP, PEOPLE_NAMESPACE, VERSION
from corral.client.intents import approval_body, decide_on, identity, submit, wait_settled
from corral.decide.idempotency import params_hash
from corral.devcluster.plane import Plane
from tests.controller_harness import CORRAL, ControllerProcess, device, events
from tests.fleet_harness import hardware_applies, running_fleet
from tests.gateway_harness import capabilities_readable, grant_agent, kubeconfig_for, stdio_client
from tests.harness import (
    api_client,
    bind_approver,
    fresh_namespace,
    grant,
    person_name,
    person_user,
    service_account_token,
    wait_for,
)

pytestmark = pytest.mark.integration

DOORS = dict.fromkeys(("door-grant", "door-mcp", "door-shown", "door-replay", "door-attack", "door-before",
                      "door-approved"), "lock")


@dataclass
class Site:
    plane: Plane
    namespace: str
    fleet: Any
    admin: kubernetes.client.ApiClient
    agent: kubernetes.client.ApiClient
    agent_kubeconfig: Path
    person: kubernetes.client.ApiClient
    person_kubeconfig: Path
    controller: ControllerProcess

    @property
    def agent_user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:agent"

    def spec(self, door: str, value: bool = True, **hold: Any) -> dict[str, Any]:
        return {"device": door, "actuator": "locked", "action": "set_state", "params": {"value": value},
                "reason": "test", "requester": self.agent_user, **hold}

    def ask(self, door: str, value: bool = True, **hold: Any) -> dict[str, Any]:
        """The agent's Intent, made at the API server with its own token, once final or waiting for a person."""
        name = f"hold-{uuid.uuid4().hex[:8]}"
        assert submit(self.agent, self.namespace, name, self.spec(door, value, **hold)).code == "CREATED"
        return wait_settled(self.admin, self.namespace, name, 20)

    def intent(self, name: str) -> dict[str, Any]:
        return kubernetes.client.CustomObjectsApi(self.admin).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "intents", name)

    def final(self, name: str) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            status: dict[str, Any] = self.intent(name).get("status") or {}
            return status if status.get("phase") in FINAL_PHASES else None
        found = wait_for(ended, f"Intent {name} to end", timeout_s=20)
        assert found is not None
        return found

    def hold_ended(self, name: str) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            hold = (self.intent(name).get("status") or {}).get("hold") or {}
            return hold if hold.get("state") not in (None, "Pending") else None
        found = wait_for(ended, f"the hold of Intent {name} to end", timeout_s=30)
        assert found is not None
        return found

    def corral(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`corral ARGS -n NS` as the person."""
        return subprocess.run([CORRAL, *args, "-n", self.namespace], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "KUBECONFIG": str(self.person_kubeconfig)})

    def locked(self, door: str) -> Any:
        return ((device(self.admin, self.namespace, door).get("status") or {}).get("reported") or {}).get("locked")


@pytest.fixture(scope="module")
def site(plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Site]:
    logs = tmp_path_factory.mktemp("hold-approvals")
    prefix = f"hap-{uuid.uuid4().hex[:8]}"
    with fresh_namespace(corral_api, "hold-approvals") as namespace:
        token = grant_agent(plane, corral_api, namespace)  # the chart's agent-operator role
        agent_kubeconfig = kubeconfig_for(plane, token, logs / "agent.kubeconfig", namespace)
        person = grant(plane, corral_api, namespace, "parent", "[get, list, read, write, approve]",
                       "[get, list, create]", "approve", person=True)
        # The chart's approver role: the person grants in advance and pauses agents.
        bind_approver(corral_api, namespace, person_name(namespace, "parent"))
        person_kubeconfig = kubeconfig_for(plane, service_account_token(corral_api, PEOPLE_NAMESPACE,
                                                                        person_name(namespace, "parent")),
                                           logs / "parent.kubeconfig", namespace)
        with capabilities_readable(corral_api, namespace, "agent"), \
                running_fleet(plane, prefix, DOORS, enroll_in=(corral_api, namespace)) as fleet:
            controller = ControllerProcess(plane, namespace, prefix, logs / "controller.log", "--approval-window", "60")
            controller.start()
            try:
                wait_for(lambda: all((s := device(corral_api, namespace, d).get("status") or {}).get("inSync")
                                     and s.get("reported") for d in DOORS), "the locks registered and reporting",
                         timeout_s=40)
                yield Site(plane, namespace, fleet, corral_api, api_client(plane, token=token), agent_kubeconfig,
                           person, person_kubeconfig, controller)
            finally:
                controller.stop()


def test_a_grant_for_locked_true_does_not_cover_a_hold_that_then_unlocks(site: Site) -> None:
    made = site.corral("grants", "create", site.agent_user, "--name", "lock-up", "--device", "door-grant",
                       "--actuator", "locked", "--value", "true", "--uses", "5", "--reason", "lock up at night")
    assert made.returncode == 0, made.stderr
    attack = site.ask("door-grant", holdFor="8s", then={"value": False})
    assert attack["status"]["phase"] == "AwaitingApproval", attack["status"]
    # Decided again once the controller's cache has the grant (it may have been a moment behind the request).
    note = "ApprovalGrant lock-up covers locked=true but not the value after the hold (then false)"
    status = wait_for(lambda: (s if note in (s := site.intent(attack["metadata"]["name"])["status"])["message"]
                               else None), "the waiting Intent to name the grant that covers locked=true alone")
    assert status["phase"] == "AwaitingApproval" and not status.get("grant"), status
    assert ("locked", True) not in hardware_applies(site.fleet, "door-grant"), "nothing ran on the grant"

    # Positive controls: the same hold without then runs at once on the grant, and so does one whose then the
    # grant lists (the waiting Intent, once a person grants the value after the hold too).
    plain = site.ask("door-grant", holdFor="3s")
    assert (plain["status"]["code"], plain["status"].get("grant")) == ("EXECUTED", "lock-up"), plain["status"]
    assert site.hold_ended(plain["metadata"]["name"])["state"] == "Reverted"
    both = site.corral("grants", "create", site.agent_user, "--name", "lock-and-open", "--device", "door-grant",
                       "--actuator", "locked", "--value", "true", "--value", "false", "--uses", "1")
    assert both.returncode == 0, both.stderr
    ran = site.final(attack["metadata"]["name"])
    assert (ran["code"], ran.get("grant")) == ("EXECUTED", "lock-and-open"), ran
    assert ran["hold"]["revertTo"] is False


def test_corral_intents_corral_approve_and_the_mcp_answers_show_then(site: Site) -> None:
    asked = site.ask("door-shown", holdFor="8s", then={"value": False})
    name = asked["metadata"]["name"]
    assert asked["status"]["phase"] == "AwaitingApproval", asked["status"]
    listed = site.corral("intents")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith(name))
    assert "locked=true for 8s, then locked=false" in row, listed.stdout

    async def through_the_gateway() -> tuple[dict[str, Any], dict[str, Any]]:
        async with stdio_client(site.agent_kubeconfig) as agent:
            status = await agent.call_tool("iot.intent_status", {"request_id": name})
            control = await agent.call_tool("iot.control", {
                "device_id": "door-mcp", "actuator": "locked", "action": "set_state", "params": {"value": True},
                "reason": "test", "hold_for_s": 5})
            return status.structured_content or {}, control.structured_content or {}

    status, control = asyncio.run(asyncio.wait_for(through_the_gateway(), 90))
    assert (status["code"], status["hold_for_s"], status["then"]) == ("AWAITING_APPROVAL", 8, False), status
    # Positive control: a hold without then says so by leaving then out; the answer still names the hold.
    assert (control["code"], control["hold_for_s"]) == ("AWAITING_APPROVAL", 5) and "then" not in control, control

    approved = site.corral("approve", name, "--reason", "a short lock", "--wait", "20")
    assert approved.returncode == 0, approved.stderr
    assert f"{name}: approval of door-shown: locked=true for 8s, then locked=false" in approved.stdout
    executed = site.final(name)
    assert executed["code"] == "EXECUTED" and executed["hold"]["revertTo"] is False, executed
    # What the person approved is what runs: the then they saw is put back.
    assert site.hold_ended(name)["state"] == "Reverted"
    assert hardware_applies(site.fleet, "door-shown")[-2:] == [("locked", True), ("locked", False)]


def test_an_intent_replayed_with_another_then_is_a_conflict_and_with_the_same_then_a_dedup(site: Site) -> None:
    name = f"replay-{uuid.uuid4().hex[:6]}"
    held = site.spec("door-replay", holdFor="8s", then={"value": False})
    assert submit(site.agent, site.namespace, name, held).code == "CREATED"
    assert submit(site.agent, site.namespace, name, held).code == "DEDUP"  # positive control
    other = submit(site.agent, site.namespace, name, {**held, "then": {"value": True}})
    assert other.code == "DENY_ID_CONFLICT", other
    # Once the earlier Intent is gone, the controller answers from the audit log by the same identity.
    assert wait_settled(site.admin, site.namespace, name, 20)["status"]["phase"] == "AwaitingApproval"
    decide_on(site.person, site.namespace, name, "Deny", "not now")
    assert site.final(name)["code"] == "DENIED_BY_APPROVER"
    objects = kubernetes.client.CustomObjectsApi(site.admin)

    def again(spec: dict[str, Any]) -> dict[str, Any]:
        objects.delete_namespaced_custom_object(GROUP, VERSION, site.namespace, "intents", name)
        wait_for(lambda: not [i for i in objects.list_namespaced_custom_object(
            GROUP, VERSION, site.namespace, "intents")["items"] if i["metadata"]["name"] == name], "the Intent gone")
        assert submit(site.agent, site.namespace, name, spec).code == "CREATED"
        return site.final(name)

    conflict = again({**held, "then": {"value": True}})
    assert conflict["code"] == "DENY_ID_CONFLICT", conflict
    assert again(held)["code"] == "DEDUP"
    assert ("locked", False) not in hardware_applies(site.fleet, "door-replay")


def test_an_approval_of_locked_true_alone_does_not_count_for_a_hold_that_then_unlocks(site: Site) -> None:
    applied = len(hardware_applies(site.fleet, "door-attack"))
    asked = site.ask("door-attack", holdFor="8s", then={"value": False})
    name = asked["metadata"]["name"]
    status = asked["status"]
    assert status["phase"] == "AwaitingApproval", status
    alone = params_hash(site.namespace, {k: v for k, v in asked["spec"].items() if k not in ("holdFor", "then")})
    assert status["paramsHash"] != alone
    # What the person was shown before this change: "locked = true"; their approval binds to that.
    me = identity(site.person)
    body = approval_body(asked, "Approve", "lock it", me, lifetime=timedelta(minutes=5))
    body["spec"]["paramsHash"] = alone
    objects = kubernetes.client.CustomObjectsApi(site.person)
    made = objects.create_namespaced_custom_object(GROUP, VERSION, site.namespace, "approvals", body)

    def refused() -> dict[str, Any] | None:
        said: dict[str, Any] = objects.get_namespaced_custom_object(
            GROUP, VERSION, site.namespace, "approvals", made["metadata"]["name"]).get("status") or {}
        return said if said.get("refused") else None
    said = wait_for(refused, "the approval of locked=true alone to be refused", timeout_s=20)
    assert said is not None and "paramsHash differs" in said["message"], said
    assert site.intent(name)["status"]["phase"] == "AwaitingApproval"
    assert hardware_applies(site.fleet, "door-attack")[applied:] == [], "nothing ran on an approval of another"

    # Positive control: the person approves what the Intent asks (the hold and its then, as shown): it runs.
    decide_on(site.person, site.namespace, name, "Approve", "a short lock, then open")
    assert site.final(name)["code"] == "EXECUTED"
    assert site.hold_ended(name)["state"] == "Reverted"
    assert hardware_applies(site.fleet, "door-attack")[applied:] == [("locked", True), ("locked", False)]


def test_a_then_the_approval_did_not_cover_is_not_put_back_despite_the_pause_while_an_approved_one_is(
        site: Site) -> None:
    """The key case: an Intent approved before `then` was bound (its status.paramsHash is the hash of locked=true
    alone) ends its hold with the door still locked; the same hold approved now is put back, agents paused."""
    applied = {door: len(hardware_applies(site.fleet, door)) for door in ("door-before", "door-approved")}
    # Long enough for the test to rewrite one status and pause agents before either hold runs out.
    before = site.ask("door-before", holdFor="10s", then={"value": False})
    approved = site.ask("door-approved", holdFor="10s", then={"value": False})
    for asked in (before, approved):
        assert asked["status"]["phase"] == "AwaitingApproval", asked["status"]
        decide_on(site.person, site.namespace, asked["metadata"]["name"], "Approve", "lock for a moment")
    for asked in (before, approved):
        executed = site.final(asked["metadata"]["name"])
        assert executed["code"] == "EXECUTED" and executed["hold"]["state"] == "Pending", executed
    # As an older controller decided it, on an approval of locked=true alone: the hash without then.
    spec = before["spec"]
    legacy = params_hash(site.namespace, {k: v for k, v in spec.items() if k not in ("holdFor", "then")})
    kubernetes.client.CustomObjectsApi(site.admin).patch_namespaced_custom_object_status(
        GROUP, VERSION, site.namespace, "intents", before["metadata"]["name"], {"status": {"paramsHash": legacy}})
    pause = {"apiVersion": API_VERSION, "kind": "AgentPause", "metadata": {"name": "agents"},
             "spec": {"paused": True, "reason": "nobody home", "by": person_user(site.namespace, "parent"),
                      "since": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}}
    pauses = kubernetes.client.CustomObjectsApi(site.person)
    pauses.create_namespaced_custom_object(GROUP, VERSION, site.namespace, "agentpauses", pause)
    try:
        assert site.ask("door-mcp", False)["status"]["code"] == "DENY_PAUSED"  # the pause is in force
        refused = site.hold_ended(before["metadata"]["name"])
        assert refused["state"] == "Refused", refused
        assert "locked=false (spec.then) is not covered by this Intent's approval" in refused["message"]
        assert "DENY_PAUSED" in refused["message"] and "stays true" in refused["message"], refused
        assert hardware_applies(site.fleet, "door-before")[applied["door-before"]:] == [("locked", True)]
        assert site.locked("door-before") is True, "the door stays locked after the hold"
        assert any(e.reason == "HoldRefused" for e in events(site.admin, site.namespace, before["metadata"]["name"]))
        # Positive control: the then a person approved is put back, though agents are paused.
        reverted = site.hold_ended(approved["metadata"]["name"])
        assert reverted["state"] == "Reverted", reverted
        assert hardware_applies(site.fleet, "door-approved")[applied["door-approved"]:] == [
            ("locked", True), ("locked", False)]
    finally:
        pauses.delete_namespaced_custom_object(GROUP, VERSION, site.namespace, "agentpauses", "agents")

"""The agents kill switch end to end: a person pauses agents with the CLI; an agent's request (and one already
waiting for approval) ends DENY_PAUSED with who paused and why, the gateway says so and refuses up front, a
person's request on the same device still runs, and resuming lets the agent act again. Real API server, real
broker, a simulated light; the pause and the resume are in the controller's audit log.

The light's brightness is low risk in its contract; a risk floor raises it to medium here, so a change of it
waits for a person, and a pause must end that wait too.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from corral.api.codes import API_VERSION, FINAL_PHASES, GROUP, PEOPLE_NAMESPACE, VERSION
from corral.audit.log import read_records
from corral.client.intents import submit, wait_settled
from corral.devcluster.plane import Plane
from tests.controller_harness import CORRAL, ControllerProcess, device
from tests.fleet_harness import running_fleet
from tests.gateway_harness import capabilities_readable, grant_agent, kubeconfig_for, stdio_client
from tests.harness import (
    api_client,
    bind_approver,
    grant,
    kubectl,
    person_name,
    person_user,
    service_account_token,
    wait_for,
)

pytestmark = pytest.mark.integration

REASON = "water in the basement"


@dataclass
class House:
    plane: Plane
    namespace: str
    admin: kubernetes.client.ApiClient
    agent: kubernetes.client.ApiClient
    agent_kubeconfig: Path
    person: kubernetes.client.ApiClient
    person_kubeconfig: Path
    controller: ControllerProcess
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def agent_username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:agent"

    @property
    def person_username(self) -> str:
        return person_user(self.namespace, "parent")

    def corral(self, *args: str) -> str:
        """`corral ARGS -n NS` as the person."""
        started = time.monotonic()
        done = subprocess.run([CORRAL, *args, "-n", self.namespace], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "KUBECONFIG": str(self.person_kubeconfig)})
        self.timings[" ".join(args[:2])] = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        return done.stdout

    def ask(self, client: kubernetes.client.ApiClient, requester: str, actuator: str, value: Any) -> dict[str, Any]:
        """An Intent on the light in `requester`'s name, once it is final or waits for a person."""
        name = f"light-{uuid.uuid4().hex[:8]}"
        action = "set_state" if actuator == "power" else "set_value"
        spec = {"device": "porch-light", "actuator": actuator, "action": action, "params": {"value": value},
                "reason": "evening", "requester": requester}
        assert submit(client, self.namespace, name, spec).code == "CREATED"
        return wait_settled(client, self.namespace, name, 20)

    def switch(self) -> dict[str, Any]:
        return kubernetes.client.CustomObjectsApi(self.admin).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "agentpauses", "agents")


@pytest.fixture
def house(plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path) -> Iterator[House]:
    prefix = f"pause-{uuid.uuid4().hex[:8]}"
    # The agent has the chart's agent-operator role (which lets it read the switch, as the gateway reads it).
    token = grant_agent(plane, corral_api, namespace)
    agent_kubeconfig = kubeconfig_for(plane, token, tmp_path / "agent.kubeconfig", namespace)
    # The person may act on the light, and has the chart's approver role (which lets them pause agents).
    person = grant(plane, corral_api, namespace, "parent", "[get, list, read, write]", "[get]", "write", person=True)
    bind_approver(corral_api, namespace, person_name(namespace, "parent"))
    person_kubeconfig = kubeconfig_for(plane, service_account_token(corral_api, PEOPLE_NAMESPACE,
                                                                    person_name(namespace, "parent")),
                                       tmp_path / "parent.kubeconfig", namespace)
    with capabilities_readable(corral_api, namespace, "agent"), \
            running_fleet(plane, prefix, {"porch-light": "light"}, enroll_in=(corral_api, namespace)):
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log",
                                       "--risk-floor", "corral-light-cct/brightness=medium", "--approval-window", "60")
        controller.start()
        try:
            wait_for(lambda: (device(corral_api, namespace, "porch-light").get("status") or {}).get("inSync"),
                     "the light registered", timeout_s=30)
            yield House(plane, namespace, corral_api, api_client(plane, token=token), agent_kubeconfig, person,
                        person_kubeconfig, controller)
        finally:
            controller.stop()


def test_paused_agents_are_denied_and_told_why_while_people_act_and_resume_restores_them(house: House) -> None:
    # Waiting for a person when the pause comes: the pause ends the wait.
    waiting = house.ask(house.agent, house.agent_username, "brightness", 40)
    assert waiting["status"]["phase"] == "AwaitingApproval", waiting["status"]

    said = house.corral("agents", "pause", "--reason", REASON)
    assert "agents paused" in said and "The controller enforces it." in said, said
    switch = house.switch()
    assert switch["spec"]["by"] == house.person_username and switch["status"]["enforced"] is True
    shown = kubectl(house.plane, "get", "agentpauses", "-n", house.namespace).stdout
    assert "PAUSED" in shown.splitlines()[0] and REASON in shown and house.person_username in shown, shown

    def final(name: str) -> dict[str, Any] | None:
        status = kubernetes.client.CustomObjectsApi(house.agent).get_namespaced_custom_object(
            GROUP, VERSION, house.namespace, "intents", name).get("status") or {}
        return status if status.get("phase") in FINAL_PHASES else None

    ended = wait_for(lambda: final(waiting["metadata"]["name"]), "the waiting request to end", timeout_s=10)
    assert ended["code"] == "DENY_PAUSED" and REASON in ended["message"], ended
    denied = house.ask(house.agent, house.agent_username, "power", True)["status"]
    assert denied["code"] == "DENY_PAUSED", denied
    assert f"by {house.person_username}: {REASON}" in denied["message"] and "corral agents resume" in denied["message"]

    async def through_the_gateway() -> tuple[str, dict[str, Any], dict[str, Any]]:
        async with stdio_client(house.agent_kubeconfig) as client:
            init = client.session.initialize_result
            listed = (await client.call_tool("iot.list_devices", {})).structured_content
            refused = await client.call_tool("iot.control", {"device_id": "porch-light", "actuator": "power",
                                                             "action": "set_state", "params": {"value": False},
                                                             "reason": "evening"})
            assert refused.is_error
            return (init.instructions or "") if init else "", listed, refused.structured_content

    started = time.monotonic()
    instructions, listed, refused = asyncio.run(asyncio.wait_for(through_the_gateway(), 60))
    house.timings["gateway session"] = time.monotonic() - started
    assert REASON in instructions and REASON in listed["agents_paused"], (instructions, listed)
    assert refused["code"] == "DENY_PAUSED" and REASON in refused["message"], refused

    # A person keeps control of the same device.
    assert house.ask(house.person, house.person_username, "power", True)["status"]["code"] == "EXECUTED"

    said = house.corral("agents", "resume", "--reason", "dry again")
    assert "agents resumed" in said and "The controller confirmed it." in said, said
    assert house.switch()["status"]["enforced"] is False
    again = house.ask(house.agent, house.agent_username, "power", False)["status"]
    assert again["code"] == "EXECUTED", again

    kinds = [(r.kind, r.data.get("by")) for r in read_records(house.controller.audit_dir)
             if r.kind.startswith("agents.")]
    assert kinds == [("agents.paused", house.person_username), ("agents.resumed", house.person_username)], kinds

    # Nobody pauses or resumes in someone else's name, and agents may read the switch, never write it.
    forged = {"apiVersion": API_VERSION, "kind": "AgentPause", "metadata": {"name": "agents"},
              "spec": {"paused": False, "reason": "", "by": "somebody-else", "since": "2026-12-01T00:00:00Z"}}
    objects = kubernetes.client.CustomObjectsApi(house.person)
    with pytest.raises(kubernetes.client.ApiException) as refused_write:
        objects.replace_namespaced_custom_object(GROUP, VERSION, house.namespace, "agentpauses", "agents", {
            **forged, "metadata": {"name": "agents", "resourceVersion": house.switch()["metadata"]["resourceVersion"]}})
    assert refused_write.value.status == 403 and "spec.by must be your own username" in str(refused_write.value.body)
    with pytest.raises(kubernetes.client.ApiException) as agent_write:
        kubernetes.client.CustomObjectsApi(house.agent).patch_namespaced_custom_object(
            GROUP, VERSION, house.namespace, "agentpauses", "agents", {"spec": {"paused": False}})
    assert agent_write.value.status == 403
    print(f"timings: {house.timings}")

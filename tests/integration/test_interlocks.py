"""Interlocks end to end: "the main water valve may not open while the leak probe reports wet".

Real plane, real controller, real firmware: a water valve and a leak probe whose `wet` reading the test sets on
the simulated board. An agent's Intent to open the valve is denied while the probe is wet, runs when it is dry,
and is denied when the probe is silent too long or missing. A person's direct `spec.target` is held while the
rule forbids it, with a condition naming the rule, and is not driven when the probe dries: only a changed target
is. The agent sees the rule in what iot.query returns. One namespace, fleet and controller for the module.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kubernetes
import pytest
import yaml

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.api.roles import USER_ROLE_RULES
from corral.client.intents import submit, wait_settled
from corral.devcluster.plane import Plane
from corral.gateway.visible import VisibleDevice
from tests.controller_harness import ControllerProcess, device, set_target
from tests.fleet_harness import hardware_applies, on_fleet, running_fleet
from tests.gateway_harness import kubeconfig_for, stdio_client
from tests.harness import (
    api_client,
    apply_yaml,
    fresh_namespace,
    grant,
    service_account_token,
    wait_for,
    wait_until_allowed,
)

pytestmark = pytest.mark.integration

VALVE, PROBE = "main-water-valve", "leak-probe"
MESSAGE = "The main water valve may not open while the leak probe reports wet."
MAX_AGE_S = 3


@dataclass
class Utility:
    namespace: str
    fleet: Any
    admin: kubernetes.client.ApiClient
    operator: kubernetes.client.ApiClient
    controller: ControllerProcess
    agent_kubeconfig: Any  # an agent with the chart's agent-reader role, for the gateway
    admin_token: str  # for the controller's readings

    def probe_reading_age(self) -> float:
        """How long ago the controller received the probe's newest `wet` sample (inf: none yet)."""
        request = urllib.request.Request(
            f"{self.controller.serve_url}/apis/readings.corral.dev/v1alpha1/namespaces/{self.namespace}/devices/"
            f"{PROBE}?window_s=0&metrics=wet", headers={"Authorization": f"Bearer {self.admin_token}"})
        context = ssl.create_default_context(cafile=str(self.controller.serve_ca))
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            samples = json.loads(response.read())["metrics"].get("wet", {}).get("samples") or []
        return float(samples[-1]["ageSeconds"]) if samples else float("inf")

    def user(self, name: str) -> str:
        return f"system:serviceaccount:{self.namespace}:{name}"

    def opened(self) -> int:
        return hardware_applies(self.fleet, VALVE).count(("open", True))

    def probe_reads(self, wet: bool) -> None:
        """Water reaches the probe (or dries up); returns once the controller has the reading (Device status)."""
        on_fleet(self.fleet, lambda: self.fleet.set_sensor(PROBE, "wet", wet))
        wait_for(lambda: ((device(self.admin, self.namespace, PROBE).get("status") or {}).get("sensors") or {})
                 .get("wet", {}).get("value") is wet, f"the controller to receive wet={wet}", timeout_s=15)

    def objects(self) -> kubernetes.client.CustomObjectsApi:
        return kubernetes.client.CustomObjectsApi(self.admin)


def interlock(name: str, condition: str, guarded: str = VALVE, max_age_s: int = MAX_AGE_S) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Interlock", "metadata": {"name": name},
            "spec": {"guards": {"devices": [guarded], "actuators": ["open"], "values": [True]},
                     "condition": condition, "maxReadingAgeSeconds": max_age_s, "message": MESSAGE}}


@pytest.fixture(scope="module")
def utility(plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Utility]:
    prefix = f"ilk-{uuid.uuid4().hex[:8]}"
    with fresh_namespace(corral_api, "interlocks") as namespace:
        operator = grant(plane, corral_api, namespace, "operator", "[get, list, read, listen, write]", "[get]", "get")
        apply_yaml(corral_api, yaml.safe_dump_all([
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "agent"},
             "rules": USER_ROLE_RULES["agent-reader"]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "agent"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agent"},
             "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": namespace}]}]), namespace)
        token = service_account_token(corral_api, namespace, "agent")
        wait_until_allowed(api_client(plane, token=token), "list", namespace, "interlocks")
        agent = kubeconfig_for(plane, token, tmp_path_factory.mktemp("agent") / "agent.kubeconfig", namespace)
        kubernetes.client.CustomObjectsApi(corral_api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, "interlocks", interlock("main-water", f'!readings["{PROBE}"]["wet"]'))
        with running_fleet(plane, prefix, {VALVE: "water_valve", PROBE: "leak_probe"}, enroll_in=(corral_api, namespace),
                           telemetry_interval_s=0.5) as fleet:
            # Opening the valve is medium risk: no approval here, so that only the interlock decides.
            controller = ControllerProcess(plane, namespace, prefix, tmp_path_factory.mktemp("interlocks") / "controller.log",
                                           "--intent-timeout", "4", "--approvals", "medium=0", "--status-interval", "1")
            controller.start()
            try:
                wait_for(lambda: all((device(corral_api, namespace, d).get("status") or {}).get("inSync")
                                     for d in (VALVE, PROBE)), "both devices registered and in sync", timeout_s=30)
                yield Utility(namespace, fleet, corral_api, operator, controller, agent, plane.admin_token)
            finally:
                controller.stop()


def open_valve(utility: Utility) -> dict[str, Any]:
    name = f"open-{uuid.uuid4().hex[:8]}"
    spec = {"device": VALVE, "actuator": "open", "action": "set_state", "params": {"value": True},
            "reason": "water the garden", "requester": utility.user("operator")}
    assert submit(utility.operator, utility.namespace, name, spec).code == "CREATED"
    intent = wait_settled(utility.operator, utility.namespace, name, timeout_s=20)
    return intent.get("status") or {}


def close_valve(utility: Utility) -> None:
    name = f"close-{uuid.uuid4().hex[:8]}"
    spec = {"device": VALVE, "actuator": "open", "action": "set_state", "params": {"value": False},
            "reason": "done", "requester": utility.user("operator")}
    submit(utility.operator, utility.namespace, name, spec)
    assert (wait_settled(utility.operator, utility.namespace, name, timeout_s=20).get("status") or {}).get("code") \
        == "EXECUTED", "closing is never guarded"


def compiled(utility: Utility, name: str) -> dict[str, Any]:
    def condition() -> dict[str, Any] | None:
        body = utility.objects().get_namespaced_custom_object(GROUP, VERSION, utility.namespace, "interlocks", name)
        found = [c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == "Compiled"]
        return found[0] if found else None

    return wait_for(condition, f"Interlock {name} to be compiled", timeout_s=15)


def test_the_rule_compiles_and_the_agent_sees_it_in_iot_query(utility: Utility) -> None:
    assert compiled(utility, "main-water")["status"] == "True"
    wait_for(lambda: (device(utility.admin, utility.namespace, VALVE).get("status") or {}).get("interlocks"),
             "the valve to list its interlock")

    async def query() -> dict[str, Any]:
        async with stdio_client(utility.agent_kubeconfig) as agent:
            answer = await agent.call_tool("iot.query", {"device_id": f"{utility.namespace}/{VALVE}"})
            return dict(answer.structured_content or {})

    detail = asyncio.run(asyncio.wait_for(query(), 60))["device"]
    assert detail["interlocks"] == [{"name": "main-water", "actuators": ["open"], "compiled": True, "message": MESSAGE,
                                     "condition": f'!readings["{PROBE}"]["wet"]'}]
    probe = device(utility.admin, utility.namespace, PROBE)
    assert not (probe.get("status") or {}).get("interlocks"), "the probe itself is not guarded"


def test_a_condition_that_does_not_compile_says_so_on_the_interlock(utility: Utility) -> None:
    utility.objects().create_namespaced_custom_object(GROUP, VERSION, utility.namespace, "interlocks",
                                                      interlock("broken", "readings[", guarded="nothing-here"))
    try:
        condition = compiled(utility, "broken")
        assert (condition["status"], condition["reason"]) == ("False", "CompileError")
        assert "Syntax error" in condition["message"]
    finally:
        utility.objects().delete_namespaced_custom_object(GROUP, VERSION, utility.namespace, "interlocks", "broken")


def test_opening_is_denied_while_the_probe_is_wet_and_runs_when_it_is_dry(utility: Utility) -> None:
    utility.probe_reads(True)
    before = utility.opened()
    wet = open_valve(utility)
    assert (wet.get("phase"), wet.get("code")) == ("Denied", "DENY_INTERLOCK")
    assert wet["message"] == f"Interlock main-water forbids this now: {MESSAGE}"
    assert utility.opened() == before, "nothing reached the valve"
    utility.probe_reads(False)
    dry = open_valve(utility)
    assert (dry.get("phase"), dry.get("code")) == ("Succeeded", "EXECUTED"), dry.get("message")
    assert utility.opened() == before + 1
    close_valve(utility)


def test_opening_is_denied_when_the_probe_went_silent_or_is_missing(utility: Utility) -> None:
    # The probe loses power: its last reading (dry) grows older than the rule allows.
    on_fleet(utility.fleet, lambda: utility.fleet.power_cycle(PROBE, off_s=MAX_AGE_S + 6))
    wait_for(lambda: utility.probe_reading_age() > MAX_AGE_S + 0.2, "the probe's last reading to grow too old",
             timeout_s=MAX_AGE_S + 10, interval_s=0.2)
    silent = open_valve(utility)
    assert silent.get("code") == "DENY_INTERLOCK"
    assert silent["message"].startswith(f"Interlock main-water forbids this now: {MESSAGE}")
    assert "too old" in silent["message"] and f"the rule allows {MAX_AGE_S} s" in silent["message"]
    # A rule over a probe that does not exist at all.
    utility.objects().create_namespaced_custom_object(GROUP, VERSION, utility.namespace, "interlocks",
                                                      interlock("ghost", '!readings["ghost-probe"]["wet"]'))
    try:
        assert compiled(utility, "ghost")["status"] == "True"
        wait_for(lambda: (device(utility.admin, utility.namespace, PROBE).get("status") or {}).get("online"),
                 "the probe to be back", timeout_s=20)
        # A fresh reading: main-water holds again, only the ghost is in the way.
        wait_for(lambda: utility.probe_reading_age() < 1.0, "a fresh reading of the probe", timeout_s=15)
        missing = open_valve(utility)
        assert missing.get("code") == "DENY_INTERLOCK"
        assert 'Interlock ghost forbids this now' in missing["message"]
        assert 'there is no Device or reading "ghost-probe"' in missing["message"]
    finally:
        utility.objects().delete_namespaced_custom_object(GROUP, VERSION, utility.namespace, "interlocks", "ghost")


def _interlocked(utility: Utility) -> dict[str, Any] | None:
    status = device(utility.admin, utility.namespace, VALVE).get("status") or {}
    found = [c for c in status.get("conditions") or [] if c["type"] == "Interlocked"]
    return found[0] if found else None


def test_a_persons_direct_target_is_held_while_forbidden_and_not_driven_when_the_rule_holds_again(
        utility: Utility) -> None:
    utility.probe_reads(True)
    before = utility.opened()
    set_target(utility.admin, utility.namespace, VALVE, {"open": True})  # kubectl apply, as a person
    held = wait_for(lambda: (c := _interlocked(utility)) and c["status"] == "True" and c,
                    "the valve's target to be held by the interlock", timeout_s=15)
    assert held["reason"] == "InterlockForbids"
    assert "spec.target.open=true is not driven: Interlock main-water forbade it" in held["message"]
    assert MESSAGE in held["message"]
    status = device(utility.admin, utility.namespace, VALVE)["status"]
    assert status["interlockedTargets"] == [{"actuator": "open", "value": True, "interlock": "main-water",
                                             "message": MESSAGE}]
    assert status["inSync"] is False
    detail = VisibleDevice(utility.namespace, VALVE, device(utility.admin, utility.namespace, VALVE), None,
                           frozenset({"read"})).detail(datetime.now(UTC))
    assert detail["interlocked_targets"][0]["interlock"] == "main-water"
    # Dry again, and the Device reconciled for an unrelated spec change: still not driven by itself.
    utility.probe_reads(False)
    patched = utility.objects().patch_namespaced_custom_object(GROUP, VERSION, utility.namespace, "devices", VALVE,
                                                               {"spec": {"overlay": {"notes": "pipes checked"}}})
    wait_for(lambda: (device(utility.admin, utility.namespace, VALVE).get("status") or {}).get(
        "observedGeneration", 0) >= patched["metadata"]["generation"], "the controller to reconcile the changed Device")
    assert utility.opened() == before
    assert (_interlocked(utility) or {}).get("status") == "True"
    # The person asks again (a changed target: closed, then open): now it is driven.
    set_target(utility.admin, utility.namespace, VALVE, {"open": False})
    wait_for(lambda: (_interlocked(utility) or {}).get("status") == "False", "the hold to end with the changed target",
             timeout_s=15)
    set_target(utility.admin, utility.namespace, VALVE, {"open": True})
    wait_for(lambda: utility.opened() == before + 1, "the valve to open", timeout_s=15)
    assert (device(utility.admin, utility.namespace, VALVE).get("status") or {}).get("inSync") is True
    set_target(utility.admin, utility.namespace, VALVE, {"open": False})

"""What guards or covers a device cannot be moved by an agent (issue 41, finding 1), end to end: real API server,
broker, controller, a simulated thermostat in the nursery and an agent over the stdio gateway.

The attack as it was replayed: an Interlock on `corral.dev/location=nursery` refused setpoint 30 and allowed 22; the
agent's `iot.set_location "Garage"` (the `annotate` verb, no approval) was EXECUTED, the label became `garage`, and
setpoint 30 was EXECUTED. Now the API server refuses an Interlock or an ApprovalGrant that selects by a label Corral
derives, saying which and why, and admits one on a label only people set; an Interlock on the heater by name still
refuses 30 after the agent renamed its location, and still allows 22. An Interlock on the location stored before
the upgrade (the CRD without its rules) fails closed: after the rename it still refuses 30, naming the label.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.api.locations import LOCATION_LABEL
from corral.client.intents import identity
from corral.devcluster.plane import Plane
from tests.controller_harness import ControllerProcess, device
from tests.fleet_harness import hardware_applies, running_fleet
from tests.gateway_harness import capabilities_readable, grant_agent, kubeconfig_for, stdio_client
from tests.harness import fresh_namespace, wait_for

pytestmark = pytest.mark.integration

HEATER = "nursery-heater"
MESSAGE = "The nursery heater is never set above 26 °C."
TOO_WARM = [26.5 + 0.5 * step for step in range(8)]  # 26.5 .. 30
REFUSED = ("the selector key corral.dev/location is derived from the overlay location, which an agent may change "
           "with iot.set_location, so it may not decide what guards or covers a Device")


@dataclass
class Nursery:
    namespace: str
    admin: kubernetes.client.ApiClient
    fleet: Any
    kubeconfig: Path
    agent: str

    def objects(self) -> kubernetes.client.CustomObjectsApi:
        return kubernetes.client.CustomObjectsApi(self.admin)

    def location_label(self) -> str | None:
        return (device(self.admin, self.namespace, HEATER)["metadata"].get("labels") or {}).get(LOCATION_LABEL)

    def setpoints(self) -> list[Any]:
        return [v for a, v in hardware_applies(self.fleet, HEATER) if a == "target_temp"]


@pytest.fixture(scope="module")
def nursery(plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Nursery]:
    tmp = tmp_path_factory.mktemp("review-selectors")
    with fresh_namespace(corral_api, "review-selectors") as namespace:
        token = grant_agent(plane, corral_api, namespace)
        kubeconfig = kubeconfig_for(plane, token, tmp / "agent.kubeconfig", namespace)
        prefix = f"sel-{uuid.uuid4().hex[:8]}"
        with capabilities_readable(corral_api, namespace, "agent"), \
                running_fleet(plane, prefix, {HEATER: "thermostat"}, enroll_in=(corral_api, namespace)) as fleet:
            controller = ControllerProcess(plane, namespace, prefix, tmp / "controller.log")
            controller.start()
            try:
                wait_for(lambda: (device(corral_api, namespace, HEATER).get("status") or {}).get("inSync"),
                         "the nursery heater registered", timeout_s=30)
                yield Nursery(namespace, corral_api, fleet, kubeconfig, f"system:serviceaccount:{namespace}:agent")
            finally:
                controller.stop()


def interlock(name: str, guards: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Interlock", "metadata": {"name": name},
            "spec": {"guards": {**guards, "actuators": ["target_temp"], "values": TOO_WARM},
                     "condition": "false", "message": MESSAGE}}


def grant(nursery: Nursery, name: str, selector: dict[str, Any]) -> dict[str, Any]:
    expires = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": API_VERSION, "kind": "ApprovalGrant", "metadata": {"name": name},
            "spec": {"grantor": identity(nursery.admin).username, "requester": nursery.agent, "selector": selector,
                     "actuators": ["target_temp"], "values": [22], "uses": 3, "expiresAt": expires}}


def refused_message(nursery: Nursery, plural: str, body: dict[str, Any]) -> str:
    with pytest.raises(kubernetes.client.ApiException) as refused:
        nursery.objects().create_namespaced_custom_object(GROUP, VERSION, nursery.namespace, plural, body)
    assert refused.value.status == 422, refused.value.body
    return str(json.loads(refused.value.body)["message"])


def test_the_api_server_refuses_a_guard_or_grant_on_a_derived_label_with_the_reason(nursery: Nursery) -> None:
    by_location = {"matchLabels": {LOCATION_LABEL: "nursery"}}
    said = refused_message(nursery, "interlocks", interlock("by-location", {"selector": by_location}))
    assert REFUSED in said and "select them by a label only people set" in said, said
    said = refused_message(nursery, "approvalgrants", grant(nursery, "by-location", by_location))
    assert REFUSED in said, said
    said = refused_message(nursery, "interlocks", interlock("by-shard", {"selector": {"matchExpressions": [
        {"key": "corral.dev/shard", "operator": "In", "values": ["0"]}]}}))
    assert "the selector key corral.dev/shard is the shard the controller assigns a Device to" in said, said
    # Positive control: a label only people set is admitted, for both kinds.
    by_room = {"matchLabels": {"room": "nursery"}}
    nursery.objects().create_namespaced_custom_object(GROUP, VERSION, nursery.namespace, "interlocks",
                                                      interlock("by-room", {"selector": by_room}), dry_run="All")
    nursery.objects().create_namespaced_custom_object(GROUP, VERSION, nursery.namespace, "approvalgrants",
                                                      grant(nursery, "by-room", by_room), dry_run="All")


def test_an_agent_that_renames_the_heaters_location_leaves_it_guarded(nursery: Nursery) -> None:
    # A person puts the heater in the nursery (the overlay, as kubectl edit does) and guards it by name.
    nursery.objects().patch_namespaced_custom_object(GROUP, VERSION, nursery.namespace, "devices", HEATER,
                                                     {"spec": {"overlay": {"location": "Nursery"}}})
    wait_for(lambda: nursery.location_label() == "nursery", "the location label nursery")
    nursery.objects().create_namespaced_custom_object(GROUP, VERSION, nursery.namespace, "interlocks",
                                                      interlock("nursery-heat", {"devices": [HEATER]}))
    wait_for(lambda: any(i.get("name") == "nursery-heat" for i in
                         (device(nursery.admin, nursery.namespace, HEATER).get("status") or {}).get("interlocks") or []),
             "the heater's status to list the Interlock", timeout_s=15)

    def setpoint(value: float, request_id: str) -> dict[str, Any]:
        return {"device_id": HEATER, "actuator": "target_temp", "action": "set_value", "params": {"value": value},
                "reason": "the baby is cold", "request_id": request_id}

    async def scenario() -> list[dict[str, Any]]:
        async with stdio_client(nursery.kubeconfig) as agent:
            calls = [("iot.control", setpoint(30, "warm-1")), ("iot.control", setpoint(22, "mild-1")),
                     ("iot.set_location", {"device_id": HEATER, "location": "Garage"}),
                     ("iot.control", setpoint(30, "warm-2")), ("iot.control", setpoint(22.5, "mild-2"))]
            return [(await agent.call_tool(tool, args)).structured_content for tool, args in calls]

    too_warm, mild, moved, still_too_warm, still_mild = asyncio.run(asyncio.wait_for(scenario(), 90))
    # Positive control: the rule refuses 30 and allows 22.
    assert too_warm["code"] == "DENY_INTERLOCK" and MESSAGE in too_warm["message"], too_warm
    assert mild["code"] == "EXECUTED", mild
    # The attack: the rename runs (it needs no approval) and the label follows it...
    assert moved["code"] == "EXECUTED", moved
    wait_for(lambda: nursery.location_label() == "garage", "the location label garage")
    # ...and the heater is guarded all the same.
    assert still_too_warm["code"] == "DENY_INTERLOCK" and "nursery-heat" in still_too_warm["message"], still_too_warm
    assert still_mild["code"] == "EXECUTED", still_mild
    assert 30 not in nursery.setpoints() and nursery.setpoints() == [22, 22.5], nursery.setpoints()


@contextmanager
def selector_rules_lifted(admin: kubernetes.client.ApiClient) -> Iterator[None]:
    """The Interlock CRD as it was before the check (its selector without the rules on derived labels), for as long
    as the block runs: what a cluster upgraded from the last release still stores. The CRD is put back after."""
    crds = kubernetes.client.ApiextensionsV1Api(admin)
    name = f"interlocks.{GROUP}"

    def read() -> dict[str, Any]:
        crd: dict[str, Any] = json.loads(crds.read_custom_resource_definition(name, _preload_content=False).data)
        crd["metadata"] = {"name": name, "resourceVersion": crd["metadata"]["resourceVersion"]}
        crd.pop("status", None)
        return crd

    current = read()
    before = copy.deepcopy(current)
    for version in before["spec"]["versions"]:
        guards = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["guards"]
        assert guards["properties"]["selector"].pop("x-kubernetes-validations"), "the rules this test lifts"
    crds.replace_custom_resource_definition(name, before)
    try:
        yield
    finally:
        current["metadata"]["resourceVersion"] = read()["metadata"]["resourceVersion"]
        crds.replace_custom_resource_definition(name, current)


def test_an_interlock_on_the_location_stored_before_the_upgrade_fails_closed_when_the_agent_renames(
        nursery: Nursery) -> None:
    """The finding's own replay, on a cluster upgraded with such an Interlock already stored (the CRD rule did not
    exist when it was made): the agent's rename no longer lets setpoint 30 through, the Interlock says why on its
    status, and a value it does not guard still runs."""
    with suppress(kubernetes.client.ApiException):  # the by-name Interlock of the test before, if it ran
        nursery.objects().delete_namespaced_custom_object(GROUP, VERSION, nursery.namespace, "interlocks",
                                                          "nursery-heat")
    nursery.objects().patch_namespaced_custom_object(GROUP, VERSION, nursery.namespace, "devices", HEATER,
                                                     {"spec": {"overlay": {"location": "Nursery"}}})
    wait_for(lambda: nursery.location_label() == "nursery", "the location label nursery")
    old = interlock("nursery-by-location", {"selector": {"matchLabels": {LOCATION_LABEL: "nursery"}}})

    def stored() -> bool:
        try:
            nursery.objects().create_namespaced_custom_object(GROUP, VERSION, nursery.namespace, "interlocks", old)
        except kubernetes.client.ApiException as err:
            if err.status != 422:  # the API server still serving the CRD with its rules: try again
                raise
            return False
        return True

    with selector_rules_lifted(nursery.admin):
        wait_for(stored, "the Interlock stored by the CRD of the last release", timeout_s=30)
    # The CRD is back: a new one like it is refused again, the stored one stays.
    def refused_again() -> bool:
        try:
            nursery.objects().create_namespaced_custom_object(
                GROUP, VERSION, nursery.namespace, "interlocks", {**old, "metadata": {"name": "again"}}, dry_run="All")
        except kubernetes.client.ApiException as err:
            return err.status == 422 and REFUSED in str(json.loads(err.body)["message"])
        return False

    wait_for(refused_again, "the CRD's rules back in force", timeout_s=30)

    def selector_condition() -> dict[str, Any] | None:
        status = nursery.objects().get_namespaced_custom_object(
            GROUP, VERSION, nursery.namespace, "interlocks", "nursery-by-location").get("status") or {}
        return next((c for c in status.get("conditions") or [] if c.get("type") == "SelectorAccepted"), None)

    condition = wait_for(lambda: (c := selector_condition()) is not None and c.get("status") == "False" and c,
                         "the stored Interlock's SelectorAccepted=False", timeout_s=30)
    assert condition["reason"] == "DerivedLabel" and LOCATION_LABEL in condition["message"], condition

    async def scenario() -> list[dict[str, Any]]:
        async with stdio_client(nursery.kubeconfig) as agent:
            calls = [("iot.set_location", {"device_id": HEATER, "location": "Garage"}),
                     ("iot.control", {"device_id": HEATER, "actuator": "target_temp", "action": "set_value",
                                      "params": {"value": 30}, "reason": "warm it", "request_id": "warm-3"}),
                     ("iot.control", {"device_id": HEATER, "actuator": "target_temp", "action": "set_value",
                                      "params": {"value": 21}, "reason": "mild", "request_id": "mild-3"})]
            return [(await agent.call_tool(tool, args)).structured_content for tool, args in calls]

    moved, too_warm, mild = asyncio.run(asyncio.wait_for(scenario(), 90))
    assert moved["code"] == "EXECUTED", moved
    wait_for(lambda: nursery.location_label() == "garage", "the location label garage")
    assert too_warm["code"] == "DENY_INTERLOCK", too_warm
    assert "nursery-by-location" in too_warm["message"] and LOCATION_LABEL in too_warm["message"], too_warm
    assert mild["code"] == "EXECUTED", mild  # not a guarded value: the rest of the heater's range still works
    assert 30 not in nursery.setpoints() and nursery.setpoints()[-1] == 21, nursery.setpoints()

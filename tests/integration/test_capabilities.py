"""Capabilities no Device uses are collected after a grace period, by a controller that can see every Device.

A plane of its own: a controller watching all namespaces on the shared plane would drive (and write the
status of) every other test's Devices.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from corral.api.capability import CapabilitySpec, capability_name
from corral.api.codes import GROUP, VERSION
from corral.client.enroll import enroll
from corral.client.install import install_api
from corral.contract.model import Contract
from corral.devcluster.plane import DevPlane, Plane
from corral_sim.catalog import contract_for
from tests.controller_harness import ControllerProcess, device
from tests.harness import api_client, wait_for
from tests.mqtt5_harness import Account, PlayedDevice, logs_in

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def own_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    dev = DevPlane(tmp_path_factory.mktemp("gc-plane"), progress=lambda line: None)
    plane = dev.up()
    try:
        yield plane
    finally:
        dev.down(purge=True)


def capabilities(admin: kubernetes.client.ApiClient) -> set[str]:
    listed = kubernetes.client.CustomObjectsApi(admin).list_cluster_custom_object(GROUP, VERSION, "capabilities")
    return {c["metadata"]["name"] for c in listed["items"]}


def test_a_capability_no_device_uses_is_collected_after_the_grace_period(own_plane: Plane, tmp_path: Path) -> None:
    """The controller watches `home` only, so it lists Devices in every namespace before it collects: a Capability
    that a Device elsewhere trusts (as another controller would have written in its status) stays."""
    admin = api_client(own_plane)
    install_api(admin)
    for namespace in ("home", "shed"):
        kubernetes.client.CoreV1Api(admin).create_namespace({"metadata": {"name": namespace}})
    lamp = enroll(admin, "home", "lamp", "light")
    enroll(admin, "shed", "pump", "relay")  # never driven by this controller
    first = contract_for("light")
    newer: dict[str, Any] = json.loads(json.dumps({**first, "fw": "1.9.0"}))  # asks for nothing more: taken at once
    controller = ControllerProcess(own_plane, "home", "gc", tmp_path / "controller.log", "--capability-grace", "3")
    played = PlayedDevice(own_plane.mqtt_port, "gc", "lamp", lamp.password, first, {"power": False, "brightness": 0})
    controller.start()
    try:
        wait_for(lambda: logs_in(played.port, Account(played.device_id, played.password)), "the lamp's broker account",
                 timeout_s=30)
        played.start()
        old = wait_for(lambda: device(admin, "home", "lamp").get("status", {}).get("acceptedCapability"),
                       "the lamp's contract", timeout_s=30)
        trusted_elsewhere(admin, old)
        played.announce(newer)
        current = wait_for(lambda: (c := device(admin, "home", "lamp")["status"].get("acceptedCapability")) != old
                           and c, "the lamp on its new contract")
        # A Capability nobody uses, made now: once it is collected, the grace period has passed for the old one too.
        canary = unused_capability(admin)
        wait_for(lambda: canary not in capabilities(admin), "the unused Capability collected", timeout_s=30)
        assert old in capabilities(admin), "a Capability a Device in another namespace trusts was collected"
        trusted_elsewhere(admin, current)  # the shed's Device moves on too: nothing uses the old one now
        wait_for(lambda: old not in capabilities(admin), "the old Capability collected", timeout_s=30)
        assert current in capabilities(admin), "the Capability in use stays"
        collected = wait_for(lambda: [e for e in capability_events(admin, old) if e.reason == "Collected"],
                             "the Collected Event")
        assert "No Device has used" in (collected[0].note or "")
    finally:
        played.close()
        controller.stop()


def unused_capability(admin: kubernetes.client.ApiClient) -> str:
    contract = Contract.model_validate({**contract_for("relay"), "device_id": "nobody"})
    name = capability_name(contract)
    kubernetes.client.CustomObjectsApi(admin).create_cluster_custom_object(GROUP, VERSION, "capabilities", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Capability", "metadata": {"name": name},
        "spec": CapabilitySpec.from_contract(contract).model_dump(mode="json", exclude_none=True)})
    return name


def trusted_elsewhere(admin: kubernetes.client.ApiClient, capability: str) -> None:
    """shed/pump trusts this Capability, as the controller of its namespace would have said in its status."""
    kubernetes.client.CustomObjectsApi(admin).patch_namespaced_custom_object_status(
        GROUP, VERSION, "shed", "devices", "pump",
        {"status": {"capability": capability, "acceptedCapability": capability}})


def capability_events(admin: kubernetes.client.ApiClient, name: str) -> list[Any]:
    return [e for e in kubernetes.client.EventsV1Api(admin).list_event_for_all_namespaces().items
            if e.regarding is not None and e.regarding.kind == "Capability" and name in (e.note or "")]

"""Capabilities no Device uses are collected after a grace period, by a controller that sees every namespace.

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

from corral.api.codes import GROUP, VERSION
from corral.client.enroll import enroll
from corral.client.install import install_api
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
    admin = api_client(own_plane)
    install_api(admin)
    for namespace in ("home", "shed"):
        kubernetes.client.CoreV1Api(admin).create_namespace({"metadata": {"name": namespace}})
    lamp = enroll(admin, "home", "lamp", "light")
    pump = enroll(admin, "shed", "pump", "relay")
    first = contract_for("light")
    newer: dict[str, Any] = json.loads(json.dumps({**first, "fw": "1.9.0"}))  # asks for nothing more: taken at once
    controller = ControllerProcess(own_plane, None, "gc", tmp_path / "controller.log", "--capability-grace", "3")
    played = [PlayedDevice(own_plane.mqtt_port, "gc", "lamp", lamp.password, first, {"power": False, "brightness": 0}),
              PlayedDevice(own_plane.mqtt_port, "gc", "pump", pump.password, contract_for("relay"), {"power": False})]
    controller.start()
    try:
        wait_for(lambda: all(logs_in(p.port, Account(p.device_id, p.password)) for p in played), "the devices' broker accounts", timeout_s=30)
        for p in played:
            p.start()
        old = wait_for(lambda: device(admin, "home", "lamp").get("status", {}).get("capability"), "the lamp's contract",
                       timeout_s=30)
        in_other_namespace = wait_for(lambda: device(admin, "shed", "pump").get("status", {}).get("capability"),
                                      "the pump's contract", timeout_s=30)
        played[0].announce(newer)
        current = wait_for(lambda: (c := device(admin, "home", "lamp")["status"].get("acceptedCapability")) != old
                           and c, "the lamp on its new contract")
        wait_for(lambda: old not in capabilities(admin), "the unused Capability collected", timeout_s=30)
        assert {current, in_other_namespace} <= capabilities(admin), "Capabilities in use stay"
        collected = wait_for(lambda: [e for e in kubernetes.client.EventsV1Api(admin).list_event_for_all_namespaces()
                                      .items if e.reason == "Collected" and old in (e.note or "")],
                             "the Collected Event")
        assert "No Device has used" in (collected[0].note or "")
    finally:
        for p in played:
            p.close()
        controller.stop()

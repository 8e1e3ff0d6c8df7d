"""Prometheus metrics of the controller and the gateway, scraped from /metrics while they work."""

from __future__ import annotations

import asyncio
import re
import urllib.request
import uuid
from pathlib import Path

import kubernetes
import pytest

from corral.devcluster.plane import Plane
from corral.devcluster.processes import free_port
from tests.controller_harness import ControllerProcess, device
from tests.fleet_harness import running_fleet
from tests.gateway_harness import HttpGateway, capabilities_readable, http_client
from tests.harness import api_client, apply_yaml, service_account_token, wait_for, wait_until_allowed

pytestmark = pytest.mark.integration

ROLE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: agent}}
rules:
- {{apiGroups: [corral.dev], resources: [devices], verbs: [get, list, watch, read, write]}}
- {{apiGroups: [corral.dev], resources: [intents], verbs: [get, create]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: agent}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: agent}}
subjects: [{{kind: ServiceAccount, name: agent, namespace: {ns}}}]
"""


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        match = re.fullmatch(r"(corral_[^\s]+) ([-+\d.eE]+|NaN)", line)
        if match:
            samples[match.group(1)] = float(match.group(2))
    return samples


def test_the_controller_and_gateway_count_what_happens(
        plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path) -> None:
    apply_yaml(corral_api, ROLE.format(ns=namespace), namespace)
    token = service_account_token(corral_api, namespace, "agent")
    wait_until_allowed(api_client(plane, token=token), "write", namespace, "devices")
    prefix = f"m-{uuid.uuid4().hex[:8]}"
    controller_metrics, gateway_metrics = free_port(), free_port()
    with capabilities_readable(corral_api, namespace, "agent"), running_fleet(plane, prefix, {"desk-light": "light"}):
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log",
                                       "--metrics-port", str(controller_metrics))
        controller.start()
        gateway = None
        try:
            wait_for(lambda: (device(corral_api, namespace, "desk-light").get("status") or {}).get("inSync"),
                     "the light registered", timeout_s=30)
            gateway = HttpGateway(plane, namespace, tmp_path / "gateway.log", "--metrics-port", str(gateway_metrics))

            async def agent() -> None:
                async with http_client(gateway.url, token) as client:
                    await client.list_tools()
                    result = await client.call_tool("iot.control", {
                        "device_id": "desk-light", "actuator": "power", "action": "set_state",
                        "params": {"value": True}, "reason": "metrics test"})
                    assert result.structured_content["code"] == "EXECUTED"
                    assert (await client.call_tool("iot.query", {"device_id": "nowhere"})).is_error

            asyncio.run(agent())
            seen = wait_for(lambda: (m := scrape(controller_metrics)).get(
                'corral_intents_total{code="EXECUTED"}') == 1 and m, "the controller to count the Intent")
            gw = scrape(gateway_metrics)
        finally:
            if gateway is not None:
                gateway.stop()
            controller.stop()
    assert seen['corral_devices{online="true"}'] == 1
    assert seen["corral_commands_sent_total"] >= 1
    assert seen['corral_command_results_total{result="acked"}'] == seen["corral_command_ack_seconds_count"] >= 1
    assert seen["corral_intent_decision_seconds_count"] == 1
    assert seen['corral_status_writes_total{reason="final"}'] >= 1
    assert seen["corral_approvals_waiting"] == 0
    assert gw['corral_mcp_tool_calls_total{outcome="EXECUTED",tool="iot.control"}'] == 1
    assert gw['corral_mcp_tool_calls_total{outcome="error",tool="iot.query"}'] == 1
    assert gw["corral_mcp_tools_list_seconds_count"] >= 1

"""The gateway under the MCP project's own tools: the conformance suite (server mode, Streamable HTTP)
and the MCP Inspector CLI (stdio).

The conformance suite is written against its "everything" fixture server: many scenarios call
fixture tools, resources and prompts (test_simple_text, test://static-text, test_prompt_with_image)
that a product server does not have. Those are listed, each with its reason, in
mcp-conformance-baseline.yml; every other scenario must pass, and a listed one that starts
passing fails the test too, so the baseline cannot go stale.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest
import yaml

from corral.devcluster.plane import Plane
from tests.controller_harness import CORRAL, ControllerProcess, device
from tests.fleet_harness import hardware_applies, running_fleet
from tests.gateway_harness import HttpGateway, capabilities_readable, grant_agent, kubeconfig_for
from tests.harness import wait_for
from tests.mcptools import inspector_cli, run_conformance

pytestmark = pytest.mark.integration

BASELINE = Path(__file__).with_name("mcp-conformance-baseline.yml")
FLEET = {"desk-light": "light", "hall-fan": "env_fan"}

@pytest.fixture
def agent(plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path
          ) -> Iterator[tuple[str, str, Path]]:
    """A running home with an agent's token: (namespace, token, the agent's kubeconfig)."""
    token = grant_agent(plane, corral_api, namespace)
    prefix = f"cf-{uuid.uuid4().hex[:8]}"
    with capabilities_readable(corral_api, namespace, "agent"), running_fleet(plane, prefix, FLEET, enroll_in=(corral_api, namespace)) as fleet:
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log")
        controller.start()
        try:
            wait_for(lambda: all((device(corral_api, namespace, d).get("status") or {}).get("inSync")
                                 for d in FLEET), "every device registered and in sync", timeout_s=30)
            yield namespace, token, kubeconfig_for(plane, token, tmp_path / "agent.kubeconfig", namespace)
            assert hardware_applies(fleet, "desk-light").count(("power", True)) <= 1
        finally:
            controller.stop()


def test_the_conformance_suite_passes_every_scenario_that_applies_to_a_product_server(
        plane: Plane, agent: tuple[str, str, Path], tmp_path: Path) -> None:
    namespace, token, _ = agent
    gateway = HttpGateway(plane, namespace, tmp_path / "gateway.log")
    try:
        result = run_conformance(gateway.url, tmp_path / "conformance", headers={"Authorization": f"Bearer {token}"})
    finally:
        gateway.stop()
    expected = yaml.safe_load(BASELINE.read_text())["server"]
    unexpected, stale = result.against_baseline(expected)
    print(f"\nconformance: {len(result.scenarios)} scenarios in {result.seconds:.1f} s; "
          f"passed: {', '.join(sorted(result.passed))}")
    assert not unexpected, f"scenarios failing that must pass:\n{result.explain()}"
    assert not stale, f"scenarios in the baseline that now pass (remove them): {stale}"
    assert len(result.scenarios) == 30 and len(result.passed) == 30 - len(expected), "the whole active suite ran"


def test_the_mcp_inspector_cli_lists_and_calls_tools_of_the_stdio_gateway(
        plane: Plane, agent: tuple[str, str, Path]) -> None:
    namespace, _, kubeconfig = agent
    env = {"KUBECONFIG": str(kubeconfig)}
    gateway = [CORRAL, "mcp", "--transport", "stdio"]
    listed = inspector_cli(["--method", "tools/list", "--", *gateway], env=env)
    tools = {t["name"]: t for t in listed["tools"]}
    assert {"iot.list_devices", "iot.query", "iot.control", "iot.intent_status"} <= set(tools)
    assert tools["iot.control"]["inputSchema"]["properties"]["device_id"]["enum"] == [
        f"{namespace}/{d}" for d in sorted(FLEET)]
    queried = inspector_cli(["--method", "tools/call", "--tool-name", "iot.query",
                             "--tool-arg", f"device_id={namespace}/desk-light", "--", *gateway], env=env)
    assert queried["structuredContent"]["device"]["reported"]["power"] is False
    done = inspector_cli(["--method", "tools/call", "--tool-name", "iot.control", "--tool-args-json", json.dumps(
        {"device_id": "desk-light", "actuator": "power", "action": "set_state", "params": {"value": True},
         "reason": "inspector test", "request_id": "inspector-on"}), "--", *gateway], env=env)
    assert done["structuredContent"]["code"] == "EXECUTED", done


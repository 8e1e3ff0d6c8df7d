"""The README's main command, `./scripts/up` (bootstrap, then `corral demo`): it reaches ready, an MCP client
lists tools, and Ctrl-C stops everything it started. Also `corral demo --kubeconfig` on an existing cluster."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import kubernetes
import pytest

from corral.devcluster.plane import DevPlane, Plane
from corral.devcluster.processes import accepts_connections, free_port
from tests.controller_harness import CORRAL
from tests.gateway_harness import MODERN, http_client

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_the_demo_runs_the_product_until_ctrl_c_and_then_stops_what_it_started(tmp_path: Path) -> None:
    port = free_port()
    state = tmp_path / "state"
    demo = subprocess.Popen([str(REPO / "scripts" / "up"), "--state-dir", str(state), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        text = "".join(_until_ready(demo))
        assert f"http://127.0.0.1:{port}/mcp" in text and "kubectl get devices -n home" in text
        token = (state / "agent-token").read_text()

        async def agent() -> tuple[list[str], int]:
            async with http_client(f"http://127.0.0.1:{port}/mcp", token, mode=MODERN) as client:
                tools = [t.name for t in (await client.list_tools()).tools]
                devices = (await client.call_tool("iot.list_devices", {})).structured_content["devices"]
                return tools, len(devices)

        tools, devices = asyncio.run(agent())
        assert "iot.control" in tools and devices == 43
        plane = DevPlane(state).running()
        assert plane is not None
    finally:
        demo.send_signal(signal.SIGINT)
        code = demo.wait(60)
    assert code == 0, demo.stderr.read()  # type: ignore[union-attr]
    assert DevPlane(state).running() is None, "the plane the demo started must be stopped"
    assert not accepts_connections(port), "the gateway must be stopped"
    assert not accepts_connections(plane.mqtt_port), "the broker must be stopped"


def test_the_demo_runs_on_an_existing_cluster_with_a_private_broker(
        plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path: Path) -> None:
    port, namespace = free_port(), f"demo-{uuid.uuid4().hex[:6]}"
    demo = subprocess.Popen([CORRAL, "demo", "--kubeconfig", str(plane.kubeconfig), "--namespace", namespace,
                             "--state-dir", str(tmp_path), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = _until_ready(demo)
        broker = next(line.split()[-1] for line in lines if line.strip().startswith("broker"))
        assert broker != plane.mqtt_url, "a private broker, not the cluster's"

        async def agent() -> int:
            async with http_client(f"http://127.0.0.1:{port}/mcp", (tmp_path / "agent-token").read_text()) as client:
                return len((await client.call_tool("iot.list_devices", {})).structured_content["devices"])

        assert asyncio.run(agent()) == 43
    finally:
        demo.send_signal(signal.SIGINT)
        code = demo.wait(60)
        kubernetes.client.CoreV1Api(corral_api).delete_namespace(namespace)
        kubernetes.client.RbacAuthorizationV1Api(corral_api).delete_cluster_role_binding("corral-demo-capability-reader")
    assert code == 0, demo.stderr.read()  # type: ignore[union-attr]
    assert not accepts_connections(int(broker.rsplit(":", 1)[1])), "the private broker must be stopped"


def _until_ready(demo: subprocess.Popen[str], timeout_s: float = 180) -> list[str]:
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(demo.stdout.readline, "")), daemon=True).start()  # type: ignore[union-attr]
    deadline = time.monotonic() + timeout_s
    while not any(line.startswith("ready") for line in lines):
        assert demo.poll() is None, f"the demo exited with {demo.returncode}: {demo.stderr.read()}"  # type: ignore[union-attr]
        assert time.monotonic() < deadline, f"no 'ready' within {timeout_s:.0f} s; so far: {lines}"
        time.sleep(0.5)
    return lines

"""The README's main command, `./scripts/up` (bootstrap, then `corral demo`): it reaches ready, an MCP client
lists tools, and a stop signal ends everything it started, however it was started. Also `corral demo
--kubeconfig` on an existing cluster.

Each test starts the demo in a process group of its own and, whatever happens, kills that group and the
plane in the end: a failing demo test must not leave a plane, broker, controller and gateway behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from corral.devcluster.plane import DevPlane, Plane
from corral.devcluster.processes import accepts_connections, free_port
from tests.controller_harness import CORRAL
from tests.gateway_harness import MODERN, http_client

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _ignore_sigint() -> None:
    # What a background job of a non-interactive shell (or nohup, or some CI runners) inherits.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def demo_process(argv: list[str], state: Path, **options: Any) -> Iterator[subprocess.Popen[str]]:
    demo = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **options)
    try:
        yield demo
    finally:
        if demo.poll() is None:  # the test failed before the demo stopped: take everything down
            with contextlib.suppress(ProcessLookupError):
                os.killpg(demo.pid, signal.SIGTERM)
            try:
                demo.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(demo.pid, signal.SIGKILL)
                demo.wait(10)
        DevPlane(state, progress=lambda line: None).down()


def test_the_demo_runs_the_product_and_a_stop_signal_ends_all_of_it_even_with_sigint_ignored_and_no_terminal(
        tmp_path: Path) -> None:
    """Started as a background job would be (SIGINT ignored), its output through a pipe that goes away before
    the stop (as `./scripts/up 2>&1 | tee demo.log` after Ctrl-C), then told to stop with SIGINT."""
    port = free_port()
    state = tmp_path / "state"
    with demo_process([str(REPO / "scripts" / "up"), "--state-dir", str(state), "--port", str(port)], state,
                      preexec_fn=_ignore_sigint) as demo:
        text = "".join(_until_ready(demo))
        assert f"http://127.0.0.1:{port}/mcp" in text and "kubectl get devices -n home" in text
        token = (state / "agent-token").read_text()

        async def agent() -> tuple[list[str], int, dict[str, Any]]:
            async with http_client(f"http://127.0.0.1:{port}/mcp", token, mode=MODERN) as client:
                tools = [t.name for t in (await client.list_tools()).tools]
                devices = (await client.call_tool("iot.list_devices", {})).structured_content["devices"]
                read = await client.call_tool("iot.read", {"device_id": "home/bedroom-fan", "window_s": 0})
                return tools, len(devices), dict(read.structured_content or {})

        tools, devices, read = asyncio.run(agent())
        assert "iot.control" in tools and devices == 43
        assert "metrics" in read, read
        plane = DevPlane(state).running()
        assert plane is not None
        raw = subprocess.run([str(plane.kubectl), "--kubeconfig", str(plane.kubeconfig), "get", "--raw",
                              "/apis/readings.corral.dev/v1alpha1/namespaces/home/devices/bedroom-fan"],
                             capture_output=True, text=True, timeout=30)
        assert raw.returncode == 0 and json.loads(raw.stdout)["kind"] == "DeviceReadings", raw.stderr
        assert demo.stdout is not None
        demo.stdout.close()  # the reader is gone: every write to the pipe fails from now on
        demo.send_signal(signal.SIGINT)
        code = demo.wait(90)
    assert code == 0
    assert "SIGINT: stopping what the demo started" in (state / "demo-logs" / "demo.log").read_text()
    assert DevPlane(state).running() is None, "the plane the demo started must be stopped"
    assert not accepts_connections(port), "the gateway must be stopped"
    assert not accepts_connections(plane.mqtt_port), "the broker must be stopped"


def test_the_demo_runs_on_an_existing_cluster_with_a_private_broker_and_sigterm_stops_it(
        plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path: Path) -> None:
    port, namespace = free_port(), f"demo-{uuid.uuid4().hex[:6]}"
    with demo_process([CORRAL, "demo", "--kubeconfig", str(plane.kubeconfig), "--namespace", namespace,
                       "--state-dir", str(tmp_path), "--port", str(port)], tmp_path) as demo:
        try:
            lines = _until_ready(demo)
            broker = next(line.split()[-1] for line in lines if line.strip().startswith("broker"))
            assert broker != plane.mqtt_url, "a private broker, not the cluster's"

            async def agent() -> int:
                async with http_client(f"http://127.0.0.1:{port}/mcp", (tmp_path / "agent-token").read_text()) as client:
                    return len((await client.call_tool("iot.list_devices", {})).structured_content["devices"])

            assert asyncio.run(agent()) == 43
            demo.send_signal(signal.SIGTERM)  # what a service manager, `timeout` or `kill` sends
            code = demo.wait(90)
        finally:
            kubernetes.client.CoreV1Api(corral_api).delete_namespace(namespace)
            kubernetes.client.RbacAuthorizationV1Api(corral_api).delete_cluster_role_binding(
                "corral-demo-capability-reader")
    assert code == 0
    assert not accepts_connections(int(broker.rsplit(":", 1)[1])), "the private broker must be stopped"
    assert not accepts_connections(port), "the gateway must be stopped"


def _until_ready(demo: subprocess.Popen[str], timeout_s: float = 180) -> list[str]:
    lines: list[str] = []
    assert demo.stdout is not None
    stream = demo.stdout

    def read() -> None:  # until ready, then the test owns the pipe
        for line in iter(stream.readline, ""):
            lines.append(line)
            if line.startswith("ready"):
                return

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not any(line.startswith("ready") for line in lines):
        assert demo.poll() is None, f"the demo exited with {demo.returncode}: {''.join(lines)[-3000:]}"
        assert time.monotonic() < deadline, f"no 'ready' within {timeout_s:.0f} s; so far: {lines}"
        time.sleep(0.5)
    return lines

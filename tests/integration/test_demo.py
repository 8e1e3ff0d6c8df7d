"""The README's main command, `./scripts/up` (bootstrap, then `corral demo`): it reaches ready, an MCP client
lists tools, and Ctrl-C stops everything it started."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from corral.devcluster.plane import DevPlane
from corral.devcluster.processes import accepts_connections, free_port
from tests.gateway_harness import MODERN, http_client

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_the_demo_runs_the_product_until_ctrl_c_and_then_stops_what_it_started(tmp_path: Path) -> None:
    port = free_port()
    state = tmp_path / "state"
    demo = subprocess.Popen([str(REPO / "scripts" / "up"), "--state-dir", str(state), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(demo.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + 180
        while not any(line.startswith("ready") for line in lines):
            assert demo.poll() is None, f"the demo exited with {demo.returncode}: {demo.stderr.read()}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, f"no 'ready' within 180 s; so far: {lines}"
            time.sleep(0.5)
        text = "".join(lines)
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

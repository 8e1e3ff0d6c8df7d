"""What the gateway's Streamable HTTP transport does per call (docs/performance.md, "Where the time goes").

A 2026-07-28 tools/call with arguments has its `Mcp-Param-*` headers checked against the tool's input schema.
The SDK finds that schema, unless the server gives it a lookup, by running the server's whole tools/list
handler before every such call; the gateway's lookup says that no Corral tool declares a header, so a call
costs one handler, not two. Both halves are proven here on the real plane: no listed tool declares one
(`x-mcp-header`), and calls with arguments run no tools/list (the gateway's own counter of tools/list).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import kubernetes
import pytest

from corral.devcluster.plane import Plane
from corral.devcluster.processes import free_port
from tests.controller_harness import ControllerProcess, device
from tests.fleet_harness import running_fleet
from tests.gateway_harness import MODERN, HttpGateway, capabilities_readable, grant_agent, http_client
from tests.harness import scrape, wait_for

pytestmark = pytest.mark.integration

LISTED = "corral_mcp_tools_list_seconds_count"


def test_modern_tool_calls_run_no_tool_listing_and_no_tool_declares_a_header(
        plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path) -> None:
    token = grant_agent(plane, corral_api, namespace)
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    port = free_port()
    with capabilities_readable(corral_api, namespace, "agent"), running_fleet(plane, prefix, {"desk-light": "light"},
                                                                          enroll_in=(corral_api, namespace)):
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log")
        controller.start()
        gateway = None
        try:
            wait_for(lambda: (device(corral_api, namespace, "desk-light").get("status") or {}).get("inSync"),
                     "the light registered", timeout_s=30)
            # --device-tools: the per-device tools, whose schemas come from the contract, are listed too.
            gateway = HttpGateway(plane, namespace, tmp_path / "gateway.log", "--device-tools",
                                  "--metrics-port", str(port))

            async def agent() -> tuple[list[dict[str, object]], float, float, list[bool]]:
                async with http_client(gateway.url, token, mode=MODERN) as client:
                    tools = (await client.list_tools()).tools
                    before = scrape(port)[LISTED]
                    errors = [(await client.call_tool("iot.query", {"device_id": f"{namespace}/desk-light"})).is_error
                              for _ in range(5)]
                    after = scrape(port)[LISTED]
                return [t.input_schema for t in tools], before, after, errors

            schemas, before, after, errors = asyncio.run(agent())
        finally:
            if gateway is not None:
                gateway.stop()
            controller.stop()
    assert len(schemas) > 4 and any(json.dumps(s).count("desk-light") for s in schemas), schemas
    assert not [s for s in schemas if "x-mcp-header" in json.dumps(s)], "a tool declares an Mcp-Param header"
    assert errors == [False] * 5, "iot.query failed"
    assert before >= 1 and after == before, f"tools/list ran {after - before} times for 5 tool calls"

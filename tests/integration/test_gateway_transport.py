"""What the gateway's Streamable HTTP transport does per call (docs/performance.md, "Where the time goes").

A handshake-era session's requests are answered with one JSON body, not an SSE stream (the SDK's client
closed each SSE answer early, which cost a new TCP connection per call); its GET stream, where the gateway's
unasked notices go, stays SSE.

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

import httpx2 as httpx
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


def test_calls_answer_with_json_and_modern_ones_run_no_tool_listing(
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
            answer, stream_type = asyncio.run(handshake_era(gateway.url, token, f"{namespace}/desk-light"))
        finally:
            if gateway is not None:
                gateway.stop()
            controller.stop()
    assert len(schemas) > 4 and any(json.dumps(s).count("desk-light") for s in schemas), schemas
    assert not [s for s in schemas if "x-mcp-header" in json.dumps(s)], "a tool declares an Mcp-Param header"
    assert errors == [False] * 5, "iot.query failed"
    assert before >= 1 and after == before, f"tools/list ran {after - before} times for 5 tool calls"
    assert answer.headers["content-type"] == "application/json", answer.headers
    assert "desk-light" in json.dumps(answer.json()["result"]["structuredContent"]["device"]), answer.text
    assert stream_type.startswith("text/event-stream"), stream_type


async def handshake_era(url: str, token: str, device_id: str) -> tuple[httpx.Response, str]:
    """A 2025-11-25 session by hand, as a client that accepts both answers: a tools/call, and its GET stream."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=30) as http:
        opened = await http.post(url, headers=headers, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        assert opened.status_code == 200, opened.text
        headers |= {"Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
        done = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert done.status_code == 202, done.text
        answer = await http.post(url, headers=headers, json={
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "iot.query", "arguments": {"device_id": device_id}}})
        async with http.stream("GET", url, headers={**headers, "Accept": "text/event-stream"}) as stream:
            stream_type = stream.headers.get("content-type", "")
        await http.delete(url, headers=headers)
    return answer, stream_type

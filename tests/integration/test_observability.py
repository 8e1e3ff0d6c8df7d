"""Observability of one tool call: Prometheus metrics scraped from /metrics, and one OpenTelemetry trace
from the MCP tool call through the Intent to the MQTT command, received over OTLP/HTTP by a receiver
in the test (the same protocol an OpenTelemetry Collector speaks)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from corral.devcluster.plane import Plane
from corral.devcluster.processes import free_port
from tests.controller_harness import ControllerProcess, device
from tests.fleet_harness import running_fleet
from tests.gateway_harness import HttpGateway, capabilities_readable, grant_agent, http_client
from tests.harness import scrape, wait_for

pytestmark = pytest.mark.integration

class OtlpReceiver(ThreadingHTTPServer):
    """Accepts OTLP/HTTP protobuf trace exports on /v1/traces and keeps every span."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                request = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
                for resource_spans in request.resource_spans:
                    service = next(a.value.string_value for a in resource_spans.resource.attributes
                                   if a.key == "service.name")
                    for scope in resource_spans.scope_spans:
                        for span in scope.spans:
                            receiver.spans.append({"name": span.name, "service": service,
                                                   "trace": span.trace_id.hex(), "id": span.span_id.hex(),
                                                   "parent": span.parent_span_id.hex()})
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def otlp(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    # Inherited by the controller and gateway processes the test starts.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.server_address[1]}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    yield receiver
    receiver.shutdown()


def test_one_tool_call_is_counted_and_traced_end_to_end(
        plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path,
        otlp: OtlpReceiver) -> None:
    token = grant_agent(plane, corral_api, namespace)
    prefix = f"m-{uuid.uuid4().hex[:8]}"
    controller_metrics, gateway_metrics = free_port(), free_port()
    with capabilities_readable(corral_api, namespace, "agent"), running_fleet(plane, prefix, {"desk-light": "light"},
                                                                          enroll_in=(corral_api, namespace)):
        controller = ControllerProcess(plane, namespace, prefix, tmp_path / "controller.log",
                                       "--metrics-port", str(controller_metrics), "--traces", "otlp")
        controller.start()
        gateway = None
        try:
            wait_for(lambda: (device(corral_api, namespace, "desk-light").get("status") or {}).get("inSync"),
                     "the light registered", timeout_s=30)
            gateway = HttpGateway(plane, namespace, tmp_path / "gateway.log", "--metrics-port", str(gateway_metrics),
                                  "--traces", "otlp")

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
                'corral_intents_total{code="EXECUTED"}') and m, "the controller to count the Intent")
            assert seen['corral_intents_total{code="EXECUTED"}'] == 1, seen
            gw = scrape(gateway_metrics)
            wanted = {"corral.gateway.control", "corral.intent.decide", "corral.intent.execute", "corral.device.command"}
            wait_for(lambda: wanted <= {s["name"] for s in otlp.spans}, "the spans of the tool call", timeout_s=15)
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

    control = next(s for s in otlp.spans if s["name"] == "corral.gateway.control")
    trace = [s for s in otlp.spans if s["trace"] == control["trace"]]
    by_id = {s["id"]: s for s in trace}
    command = next(s for s in trace if s["name"] == "corral.device.command")
    execute = by_id[command["parent"]]
    assert execute["name"] == "corral.intent.execute" and execute["service"] == "corral-controller"
    decide = next(s for s in trace if s["name"] == "corral.intent.decide")
    assert by_id[execute["parent"]] is control and by_id[decide["parent"]] is control
    assert control["service"] == "corral-gateway"
    assert by_id[control["parent"]]["name"].startswith("tools/call"), "the SDK's own server span is the root"

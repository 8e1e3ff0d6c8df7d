"""Control latency: MCP iot.control on a low-risk actuator until EXECUTED, next to two floors measured in
the same run on the same plane:

- the Kubernetes floor: create a plain object (a ConfigMap) and see it in a watch;
- the MQTT floor: a command to the same device and its ack.

Real parts: the local kube-apiserver, Mosquitto, one simulated light (real firmware), the controller
(`corral run`) and the gateway (`corral mcp --transport http`), driven by the official MCP client
(protocol 2026-07-28). Each call alternates the light's power with a new request_id; the MQTT floor is a
`get_state` command published straight to the device, which acks with its state and changes nothing.
Also counted: the API requests each call costs, from the API server's own counters, and the CPU per
Intent of each process (API server, controller, gateway, broker, firmware simulator), each from its own
accounting in /proc, read before and after the calls.

    .venv/bin/python bench/control_latency.py [--calls 200] [--fresh-plane] [--tls]

Every client logs in with its own account (the device with its enrollment, the raw MQTT client with an
account of its own); `--tls` puts the device, the controller and the raw client on the TLS listener.

Prints p50/p99 of each and the multiples of each floor at p50 and p99; writes bench/results/control_latency-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

from common import (
    Corral,
    CpuClock,
    agent_namespace,
    api_requests,
    bench_plane,
    floor_figures,
    kubernetes_floor,
    mqtt_floor,
    percentile,
    print_cpu,
    print_floors,
    requests_per,
    running_corral,
    say,
    write_result,
)
from corral.devcluster.plane import Plane
from tests.gateway_harness import MODERN, http_client


async def control_calls(url: str, token: str, calls: int, device: str = "bench-light") -> tuple[list[float], list[str]]:
    times, codes = [], []
    async with http_client(url, token, mode=MODERN) as client:
        await client.list_tools()
        for i in range(calls):
            args = {"device_id": device, "actuator": "power", "action": "set_state",
                    "params": {"value": i % 2 == 0}, "reason": "latency benchmark", "request_id": f"lat-{uuid.uuid4().hex[:12]}"}
            started = time.perf_counter()
            result = await client.call_tool("iot.control", args)
            times.append((time.perf_counter() - started) * 1000)
            codes.append((result.structured_content or {}).get("code", "error"))
    return times, codes


def measure(plane: Plane, namespace: str, corral: Corral, token: str, calls: int, device: str = "bench-light",
            tls: bool = False) -> dict[str, Any]:
    """One run on a running pipeline: the calls (with the API requests and CPU they cost), then both floors."""
    say(f"  {calls} iot.control calls")
    before, cpu_before, started = api_requests(plane), corral.cpu.read(), time.monotonic()
    control, codes = asyncio.run(control_calls(corral.url, token, calls, device))
    cpu = CpuClock.per_intent(cpu_before, corral.cpu.read(), codes.count("EXECUTED"), time.monotonic() - started)
    per_call = requests_per(before, api_requests(plane), calls)
    say(f"  {calls} raw MQTT round trips")
    floor = mqtt_floor(plane, corral.prefix, device, calls, tls)
    say(f"  {calls} Kubernetes create -> watch round trips")
    kube_floor = asyncio.run(kubernetes_floor(plane, namespace, calls))
    result = {
        "calls": calls, "tls": tls, "executed": codes.count("EXECUTED"),
        "control_p50_ms": round(statistics.median(control), 1), "control_p99_ms": round(percentile(control, 0.99), 1),
    }
    result |= floor_figures(result["control_p50_ms"], result["control_p99_ms"], kube_floor, floor)
    return result | {"api_requests_per_call": round(sum(per_call.values()), 2), "api_requests": per_call, "cpu": cpu}


def report(result: dict[str, Any]) -> None:
    print(f"iot.control -> EXECUTED ({result['executed']}/{result['calls']}): p50 {result['control_p50_ms']} ms, "
          f"p99 {result['control_p99_ms']} ms")
    print_floors("iot.control", result)
    print(f"API requests per call: {result['api_requests_per_call']} {result['api_requests']}")
    print_cpu(result["cpu"], result["executed"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--fresh-plane", action="store_true", help="a plane of its own, not `corral dev up`'s")
    parser.add_argument("--tls", action="store_true", help="devices, controller and the raw client over mqtts://")
    args = parser.parse_args()
    with bench_plane(args.fresh_plane) as plane, agent_namespace(plane) as (admin, namespace, token), \
            running_corral(plane, admin, namespace, {"bench-light": "light"}, tls=args.tls) as corral:
        result = measure(plane, namespace, corral, token, args.calls, tls=args.tls)
    report(result)
    write_result("control_latency", result)

if __name__ == "__main__":
    main()

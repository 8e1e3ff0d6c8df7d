"""Throughput: sustained Intents per second through the whole pipeline, with N concurrent agents.

Each agent is an MCP client (Streamable HTTP, protocol 2026-07-28) calling iot.control on lights of its
own, one call after another, for --seconds: MCP gateway -> Intent -> decision -> target -> MQTT command ->
firmware -> ack -> EXECUTED. Real kube-apiserver, Mosquitto, simulated firmware, controller and gateway.

    .venv/bin/python bench/throughput.py [--agents 8] [--lights 32] [--seconds 30] [--floor-calls 50]

Also measured in the same run, before and after the load: the Kubernetes floor (create a ConfigMap, see it
in a watch) and the MQTT floor (a command to a light, its ack), and the call latency as a multiple of each;
the API requests per Intent (the API server's own counters); the CPU per Intent of each process (API
server, controller, gateway, broker, firmware simulator), each from its own accounting in /proc, read at
the start and the end of the load.

Prints executed Intents per second and the latency of each call; writes bench/results/throughput-<time>.json.
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
    retention_args,
    running_corral,
    say,
    write_result,
)
from corral.devcluster.plane import Plane
from tests.gateway_harness import MODERN, http_client


async def agent(url: str, token: str, lights: list[str], until: float, times: list[float], codes: list[str]) -> None:
    async with http_client(url, token, mode=MODERN) as client:
        await client.list_tools()
        i = 0
        while time.monotonic() < until:
            light = lights[i % len(lights)]
            args = {"device_id": light, "actuator": "power", "action": "set_state",
                    "params": {"value": (i // len(lights)) % 2 == 0}, "reason": "throughput benchmark",
                    "request_id": f"tp-{uuid.uuid4().hex[:12]}"}
            started = time.perf_counter()
            result = await client.call_tool("iot.control", args)
            times.append((time.perf_counter() - started) * 1000)
            codes.append((result.structured_content or {}).get("code", "error"))
            i += 1


async def run_agents(url: str, token: str, lights: list[str], agents: int, seconds: float
                     ) -> tuple[list[float], list[str], float]:
    times: list[float] = []
    codes: list[str] = []
    started = time.monotonic()
    until = started + seconds
    shares = [lights[i::agents] for i in range(agents)]
    await asyncio.gather(*(agent(url, token, share, until, times, codes) for share in shares))
    return times, codes, time.monotonic() - started


def floors(plane: Plane, namespace: str, corral: Corral, device: str, calls: int) -> tuple[list[float], list[float]]:
    """Both floors, one after the other on the quiet pipeline: (Kubernetes, MQTT) in ms."""
    say(f"  {calls} Kubernetes create -> watch round trips, {calls} raw MQTT round trips")
    return asyncio.run(kubernetes_floor(plane, namespace, calls)), mqtt_floor(plane, corral.prefix, device, calls)


def measure(plane: Plane, namespace: str, corral: Corral, token: str, lights: list[str], agents: int,
            seconds: float, floor_calls: int) -> dict[str, Any]:
    """One run on a running pipeline: the floors, the load (with the API requests and CPU it costs), the floors
    again. The floors are taken on either side of the load, not under it: the floor of this plane, this
    machine and this moment, which is what Corral is measured against."""
    kube_before, mqtt_before = floors(plane, namespace, corral, lights[0], floor_calls)
    say(f"  {agents} agents for {seconds:.0f} s")
    before, cpu_before = api_requests(plane), corral.cpu.read()
    times, codes, elapsed = asyncio.run(run_agents(corral.url, token, lights, agents, seconds))
    cpu_after = corral.cpu.read()
    per_call = requests_per(before, api_requests(plane), len(codes))
    kube_after, mqtt_after = floors(plane, namespace, corral, lights[0], floor_calls)
    executed = codes.count("EXECUTED")
    result: dict[str, Any] = {
        "agents": agents, "lights": len(lights), "seconds": round(elapsed, 1), "calls": len(codes),
        "executed": executed, "other_codes": sorted({c for c in codes if c != "EXECUTED"}),
        "intents_per_s": round(executed / elapsed, 1),
        "latency_p50_ms": round(statistics.median(times), 1), "latency_p99_ms": round(percentile(times, 0.99), 1),
    }
    result |= floor_figures(result["latency_p50_ms"], result["latency_p99_ms"], kube_before + kube_after,
                            mqtt_before + mqtt_after)
    result |= {"kube_floor_p50_ms_before_after": [round(statistics.median(kube_before), 2),
                                                  round(statistics.median(kube_after), 2)],
               "mqtt_p50_ms_before_after": [round(statistics.median(mqtt_before), 2),
                                            round(statistics.median(mqtt_after), 2)]}
    return result | {"api_requests_per_call": round(sum(per_call.values()), 2), "api_requests": per_call,
                      "cpu": CpuClock.per_intent(cpu_before, cpu_after, executed, elapsed)}


def report(result: dict[str, Any]) -> None:
    print(f"{result['agents']} agents, {result['lights']} lights: {result['intents_per_s']} Intents/s EXECUTED "
          f"({result['executed']} of {result['calls']} calls in {result['seconds']:.0f} s); call latency p50 "
          f"{result['latency_p50_ms']} ms, p99 {result['latency_p99_ms']} ms; API requests per call "
          f"{result['api_requests_per_call']} {result['api_requests']}")
    print_floors("the call latency under load", result)
    print(f"  (floor p50 before / after the load: Kubernetes {result['kube_floor_p50_ms_before_after']} ms, "
          f"MQTT {result['mqtt_p50_ms_before_after']} ms)")
    print_cpu(result["cpu"], result["executed"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--lights", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--floor-calls", type=int, default=50, help="round trips of each floor, before and after")
    parser.add_argument("--fresh-plane", action="store_true", help="a plane of its own, not `corral dev up`'s")
    args = parser.parse_args()
    lights = [f"light-{i:03d}" for i in range(args.lights)]
    with bench_plane(args.fresh_plane) as plane, agent_namespace(plane) as (admin, namespace, token), \
            running_corral(plane, admin, namespace, dict.fromkeys(lights, "light"), *retention_args(60)) as corral:
        result = measure(plane, namespace, corral, token, lights, args.agents, args.seconds, args.floor_calls)
    report(result)
    write_result("throughput", result)


if __name__ == "__main__":
    main()

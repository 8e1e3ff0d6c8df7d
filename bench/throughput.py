"""Throughput: sustained Intents per second through the whole pipeline, with N concurrent agents.

Each agent is an MCP client (Streamable HTTP, protocol 2026-07-28) calling iot.control on lights of its
own, one call after another, for --seconds: MCP gateway -> Intent -> decision -> target -> MQTT command ->
firmware -> ack -> EXECUTED. Real kube-apiserver, Mosquitto, simulated firmware, controller and gateway.

    .venv/bin/python bench/throughput.py [--agents 8] [--lights 32] [--seconds 30]

Prints executed Intents per second and the latency of each call; writes bench/results/throughput-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from common import (
    agent_namespace,
    api_requests,
    bench_plane,
    percentile,
    requests_per,
    running_corral,
    say,
    write_result,
)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--lights", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--fresh-plane", action="store_true", help="a plane of its own, not `corral dev up`'s")
    args = parser.parse_args()
    lights = [f"light-{i:03d}" for i in range(args.lights)]
    with bench_plane(args.fresh_plane) as plane, agent_namespace(plane) as (admin, namespace, token), \
            running_corral(plane, admin, namespace, dict.fromkeys(lights, "light"), "--intent-ttl", "60") as (url, _):
        say(f"  {args.agents} agents for {args.seconds:.0f} s")
        before = api_requests(plane)
        times, codes, elapsed = asyncio.run(run_agents(url, token, lights, args.agents, args.seconds))
        per_call = requests_per(before, api_requests(plane), len(codes))
    executed = codes.count("EXECUTED")
    result = {
        "agents": args.agents, "lights": args.lights, "seconds": round(elapsed, 1), "calls": len(codes),
        "executed": executed, "other_codes": sorted({c for c in codes if c != "EXECUTED"}),
        "intents_per_s": round(executed / elapsed, 1),
        "latency_p50_ms": round(statistics.median(times), 1), "latency_p99_ms": round(percentile(times, 0.99), 1),
        "api_requests_per_call": round(sum(per_call.values()), 2), "api_requests": per_call,
    }
    print(f"{args.agents} agents, {args.lights} lights: {result['intents_per_s']} Intents/s EXECUTED "
          f"({executed} of {len(codes)} calls in {elapsed:.0f} s); call latency p50 {result['latency_p50_ms']} ms, "
          f"p99 {result['latency_p99_ms']} ms; API requests per call {result['api_requests_per_call']} {per_call}")
    write_result("throughput", result)


if __name__ == "__main__":
    main()

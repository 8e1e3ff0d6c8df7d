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
import tempfile
import time
import uuid
from pathlib import Path

from common import agent_namespace, bench_plane, percentile, say, wait_registered, write_result

from tests.controller_harness import ControllerProcess
from tests.fleet_harness import running_fleet
from tests.gateway_harness import MODERN, HttpGateway, http_client


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
    args = parser.parse_args()
    lights = [f"light-{i:03d}" for i in range(args.lights)]
    with bench_plane() as plane, agent_namespace(plane) as (admin, namespace, token):
        prefix = f"bench-{uuid.uuid4().hex[:6]}"
        with tempfile.TemporaryDirectory() as logs, running_fleet(plane, prefix, dict.fromkeys(lights, "light")):
            controller = ControllerProcess(plane, namespace, prefix, Path(logs) / "controller.log",
                                           "--intent-ttl", "60")
            controller.start()
            gateway = None
            try:
                wait_registered(admin, namespace, len(lights))
                gateway = HttpGateway(plane, namespace, Path(logs) / "gateway.log", "--rate-limit", "0/1")
                say(f"  {args.agents} agents for {args.seconds:.0f} s")
                times, codes, elapsed = asyncio.run(run_agents(gateway.url, token, lights, args.agents, args.seconds))
            finally:
                if gateway is not None:
                    gateway.stop()
                controller.stop()
    executed = codes.count("EXECUTED")
    result = {
        "agents": args.agents, "lights": args.lights, "seconds": round(elapsed, 1), "calls": len(codes),
        "executed": executed, "other_codes": sorted({c for c in codes if c != "EXECUTED"}),
        "intents_per_s": round(executed / elapsed, 1),
        "latency_p50_ms": round(statistics.median(times), 1), "latency_p99_ms": round(percentile(times, 0.99), 1),
    }
    print(f"{args.agents} agents, {args.lights} lights: {result['intents_per_s']} Intents/s EXECUTED "
          f"({executed} of {len(codes)} calls in {elapsed:.0f} s); call latency p50 {result['latency_p50_ms']} ms, "
          f"p99 {result['latency_p99_ms']} ms")
    write_result("throughput", result)


if __name__ == "__main__":
    main()

"""tools/list latency of the MCP gateway for a caller who sees N devices (default 500).

Real parts only: the local kube-apiserver, Mosquitto, N simulated devices (real
firmware, a mix of device types), the controller registering them, and
`corral mcp --transport http`. An agent identity (a ServiceAccount allowed to
read and write every device) calls tools/list over Streamable HTTP with the
official MCP client, on both protocol generations, once with the fixed tools
and once with `--device-tools` (one tool per actuator). The answers come from
the gateway's watch cache; the figure is what the client waits.

    .venv/bin/python bench/gateway_tools_list.py [--devices 500] [--calls 200]

Prints the figures and writes bench/results/gateway_tools_list-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from common import agent_namespace, bench_plane, percentile, say, wait_registered, write_result
from tests.controller_harness import ControllerProcess
from tests.fleet_harness import running_fleet
from tests.gateway_harness import MODERN, HttpGateway, http_client

TYPES = ["light", "env_fan", "sht30", "relay", "blind", "thermostat", "door_contact", "rgb_light"]

async def all_tools(client: Any) -> tuple[list[Any], int]:
    """Every page of tools/list, and how many pages there were."""
    tools, cursor, pages = [], None, 0
    while True:
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            return tools, pages


async def measure(url: str, token: str, mode: str, calls: int) -> dict[str, Any]:
    async with http_client(url, token, mode=mode) as client:
        started = time.perf_counter()
        first, pages = await all_tools(client)
        cold_ms = (time.perf_counter() - started) * 1000
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            await all_tools(client)
            times.append((time.perf_counter() - started) * 1000)
        listed = await client.call_tool("iot.list_devices", {})
    return {"mode": mode, "tools": len(first), "pages": pages, "devices_listed": len(listed.structured_content["devices"]),
            "first_call_ms": round(cold_ms, 1),
            "median_ms": round(statistics.median(times), 2), "p99_ms": round(percentile(times, 0.99), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=500)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()

    with bench_plane() as plane, agent_namespace(plane) as (admin, namespace, token):
        fleet = {f"d{i:05d}": TYPES[i % len(TYPES)] for i in range(args.devices)}
        prefix = f"bench-{uuid.uuid4().hex[:6]}"
        runs = []
        with tempfile.TemporaryDirectory() as logs, running_fleet(plane, prefix, fleet, enroll_in=(admin, namespace)):
            controller = ControllerProcess(plane, namespace, prefix, Path(logs) / "controller.log")
            controller.start()
            try:
                wait_registered(admin, namespace, args.devices)
                for extra in ((), ("--device-tools",)):
                    gateway = HttpGateway(plane, namespace, Path(logs) / "gateway.log", *extra)
                    try:
                        for mode in ("legacy", MODERN):
                            run = asyncio.run(measure(gateway.url, token, mode, args.calls))
                            run["device_tools"] = bool(extra)
                            runs.append(run)
                            say(f"  {run}")
                    finally:
                        gateway.stop()
            finally:
                controller.stop()
        for run in runs:
            print(f"tools/list, {run['devices_listed']} visible devices, {run['tools']} tools in {run['pages']} pages "
                  f"({'with' if run['device_tools'] else 'without'} device tools, {run['mode']}): "
                  f"median {run['median_ms']} ms, p99 {run['p99_ms']} ms over {args.calls} calls "
                  f"(first call {run['first_call_ms']} ms)")
        write_result("gateway_tools_list", {"devices": args.devices, "calls": args.calls, "runs": runs})


if __name__ == "__main__":
    main()

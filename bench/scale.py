"""Scale: one controller with 1,000 and 5,000 simulated devices: memory, time to ready, tools/list.

For each size: start the fleet (real firmware, telemetry every 30 s), then the controller; record how
long until every device is registered (Device objects created, first start) and the controller's RSS;
restart the controller and record how long until it knows every device online again (its own
corral_devices gauge: ready); then start the gateway and time tools/list for an agent who sees them all.

    .venv/bin/python bench/scale.py [--sizes 1000,5000]

Writes bench/results/scale-<time>.json.
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
from corral.devcluster.processes import free_port
from tests.controller_harness import ControllerProcess
from tests.fleet_harness import running_fleet
from tests.gateway_harness import MODERN, HttpGateway, http_client
from tests.harness import rss_mib, scrape

TYPES = ["light", "env_fan", "sht30", "relay", "blind", "thermostat", "door_contact", "rgb_light"]


def start_controller(plane, namespace: str, prefix: str, logs: Path, metrics: int) -> tuple[ControllerProcess, float]:
    controller = ControllerProcess(plane, namespace, prefix, logs / "controller.log", "--metrics-port", str(metrics))
    started = time.monotonic()
    controller.start()
    return controller, started


def seconds_until_ready(metrics: int, count: int, started: float, timeout_s: float = 600) -> float:
    while True:
        try:
            if scrape(metrics).get('corral_devices{online="true"}', 0) >= count:
                return time.monotonic() - started
        except OSError:
            pass
        if time.monotonic() - started > timeout_s:
            raise TimeoutError("the controller never saw every device online")
        time.sleep(0.25)


async def tools_list_ms(url: str, token: str, calls: int = 100) -> list[float]:
    async with http_client(url, token, mode=MODERN) as client:
        await client.list_tools()
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            await client.list_tools()
            times.append((time.perf_counter() - started) * 1000)
    return times


def one_size(plane, size: int) -> dict[str, float]:
    with agent_namespace(plane) as (admin, namespace, token), tempfile.TemporaryDirectory() as logs:
        prefix = f"scale-{uuid.uuid4().hex[:6]}"
        fleet = {f"d{i:05d}": TYPES[i % len(TYPES)] for i in range(size)}
        with running_fleet(plane, prefix, fleet, telemetry_interval_s=30.0, connect_spread_s=size / 500,
                           enroll_in=(admin, namespace)):
            time.sleep(size / 500 + 2)  # the fleet is connected before the controller starts
            metrics = free_port()
            controller, started = start_controller(plane, namespace, prefix, Path(logs), metrics)
            try:
                say(f"  {size}: first start, registering")
                first_ready = seconds_until_ready(metrics, size, started)
                wait_registered(admin, namespace, size, timeout_s=900)
                registered_s = time.monotonic() - started
                time.sleep(10)
                rss_first = rss_mib(controller.proc.pid)
            finally:
                controller.stop()
            controller, started = start_controller(plane, namespace, prefix, Path(logs), metrics)
            gateway = None
            try:
                say(f"  {size}: restart")
                restart_ready = seconds_until_ready(metrics, size, started)
                time.sleep(10)
                rss_restart = rss_mib(controller.proc.pid)
                gateway = HttpGateway(plane, namespace, Path(logs) / "gateway.log")
                times = asyncio.run(tools_list_ms(gateway.url, token))
                rss_gateway = rss_mib(gateway.proc.pid)
            finally:
                if gateway is not None:
                    gateway.stop()
                controller.stop()
    return {"devices": size, "first_start_all_online_s": round(first_ready, 1),
            "first_start_all_registered_s": round(registered_s, 1), "restart_ready_s": round(restart_ready, 1),
            "controller_rss_mib_after_first_start": round(rss_first), "controller_rss_mib_after_restart": round(rss_restart),
            "gateway_rss_mib": round(rss_gateway), "tools_list_p50_ms": round(statistics.median(times), 2),
            "tools_list_p99_ms": round(percentile(times, 0.99), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,5000")
    args = parser.parse_args()
    runs = []
    with bench_plane() as plane:
        for size in (int(s) for s in args.sizes.split(",")):
            run = one_size(plane, size)
            runs.append(run)
            say(f"  {run}")
    for run in runs:
        print(f"{run['devices']} devices: ready after restart in {run['restart_ready_s']} s "
              f"(first start: all online {run['first_start_all_online_s']} s, all registered "
              f"{run['first_start_all_registered_s']} s); controller RSS {run['controller_rss_mib_after_restart']} MiB; "
              f"tools/list p50 {run['tools_list_p50_ms']} ms, p99 {run['tools_list_p99_ms']} ms")
    write_result("scale", {"runs": runs})


if __name__ == "__main__":
    main()

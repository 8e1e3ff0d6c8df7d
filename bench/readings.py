"""Readings: MCP iot.read of a 60 s window at 1 Hz, next to direct GETs of the controller's readings; and the
controller's memory per 1,000 devices with their sample buffers full.

1. Latency. Real parts: the local kube-apiserver, Mosquitto, simulated env_fan devices (real firmware,
   temperature, humidity and rssi every second), the controller (`corral run`) and the HTTP gateway
   (`corral mcp --transport http --readings-url URL --readings-ca FILE`: straight to the controller's
   HTTPS server, not through an APIService), driven by the official MCP client (protocol 2026-07-28) with
   an agent-operator ServiceAccount's token (audience corral-gateway). Once the controller holds at least
   60 s of samples of every metric, `iot.read {device_id: NS/NAME, window_s: 60}` is called N times (the
   devices in turn, after a few calls not counted). For comparison, with the same bearer token: N direct
   `GET /apis/readings.corral.dev/v1alpha1/namespaces/NS/devices/NAME?window_s=60` on the controller,
   on one kept-alive connection (as the gateway keeps one), and on a new connection (TLS handshake) each.
2. Memory, in this process (no plane): `--devices` SensorBuffers (default capacity), each filled with
   `capacity` samples of three metrics (distinct floats for temperature and humidity, ints for rssi, as
   parsed telemetry gives them), measured with tracemalloc, and as RSS growth (a separate fill, without
   tracemalloc) to cross-check.

    .venv/bin/python bench/readings.py [--calls 300] [--live-devices 2] [--fresh-plane] [--devices 1000]
    .venv/bin/python bench/readings.py --memory-only [--devices 1000]

Prints p50/p90/p99 and samples per call, bytes per sample and MiB per 1,000 devices; writes
bench/results/readings-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import ssl
import statistics
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from common import agent_namespace, bench_plane, percentile, say, wait_registered, write_result
from corral.devcluster.plane import Plane
from corral.devices.messages import Sample
from corral.devices.telemetry import SensorBuffer
from tests.controller_harness import ControllerProcess
from tests.fleet_harness import running_fleet
from tests.gateway_harness import MODERN, HttpGateway, http_client
from tests.harness import rss_mib

WINDOW_S = 60
METRICS = ("temperature", "humidity", "rssi")
WARMUP_CALLS = 5
READINGS = "/apis/readings.corral.dev/v1alpha1"


def figures(times: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(times), 2), "p90_ms": round(percentile(times, 0.90), 2),
            "p99_ms": round(percentile(times, 0.99), 2)}


# 1. iot.read and the direct GET -------------------------------------------------------------------------


@contextmanager
def readings_corral(plane: Plane, admin: Any, namespace: str, devices: dict[str, str]
                    ) -> Iterator[tuple[str, ControllerProcess]]:
    """Devices (id -> type) at 1 Hz, the controller and the HTTP gateway (no rate limit) reading the
    controller's HTTPS server directly, all devices registered: (the gateway's URL, the controller)."""
    prefix = f"bench-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as logs, \
            running_fleet(plane, prefix, devices, enroll_in=(admin, namespace), telemetry_interval_s=1.0):
        controller = ControllerProcess(plane, namespace, prefix, Path(logs) / "controller.log")
        controller.start()
        gateway = None
        try:
            wait_registered(admin, namespace, len(devices))
            gateway = HttpGateway(plane, namespace, Path(logs) / "gateway.log", "--rate-limit", "0/1",
                                  "--readings-url", controller.serve_url, "--readings-ca", str(controller.serve_ca))
            yield gateway.url, controller
        finally:
            if gateway is not None:
                gateway.stop()
            controller.stop()


def readings_url(controller: ControllerProcess, namespace: str, name: str) -> str:
    return f"{controller.serve_url}{READINGS}/namespaces/{namespace}/devices/{name}"


async def wait_buffered(controller: ControllerProcess, namespace: str, names: list[str], token: str,
                        timeout_s: float = 240) -> float:
    """Seconds until the controller holds samples of every metric of every device going back more than
    WINDOW_S (progress to stderr)."""
    context = ssl.create_default_context(cafile=str(controller.serve_ca))
    started = time.monotonic()
    last = -1
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
        while True:
            reach: list[float] = []
            for name in names:
                async with session.get(readings_url(controller, namespace, name), params={"window_s": "3600"},
                                       ssl=context) as response:
                    body = await response.json()
                    if response.status != 200:
                        raise RuntimeError(f"readings of {name}: {response.status} {body}")
                metrics = body.get("metrics") or {}
                reach += [(metrics.get(m) or {}).get("samples", [{}])[0].get("ageSeconds", 0.0)
                          if (metrics.get(m) or {}).get("samples") else 0.0 for m in METRICS]
            held = int(min(reach))
            if held // 10 != last // 10:
                say(f"  the controller holds {held} s of samples (waiting for > {WINDOW_S} s)")
                last = held
            if min(reach) > WINDOW_S + 1:
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"only {min(reach):.0f} s of samples held after {timeout_s:.0f} s")
            await asyncio.sleep(1)


async def read_calls(url: str, token: str, ids: list[str], calls: int) -> tuple[list[float], list[int], list[str]]:
    """iot.read of WINDOW_S on the devices in turn: (milliseconds, samples returned, refusal codes)."""
    times, samples, refusals = [], [], []
    async with http_client(url, token, mode=MODERN) as client:
        await client.list_tools()
        for i in range(WARMUP_CALLS + calls):
            started = time.perf_counter()
            result = await client.call_tool("iot.read", {"device_id": ids[i % len(ids)], "window_s": WINDOW_S})
            elapsed = (time.perf_counter() - started) * 1000
            if i < WARMUP_CALLS:
                continue
            content = result.structured_content or {}
            if result.is_error or "metrics" not in content:
                refusals.append(str(content.get("code", "error")))
                continue
            times.append(elapsed)
            samples.append(sum(len(m.get("samples") or []) for m in content["metrics"].values()))
            if (i + 1 - WARMUP_CALLS) % 100 == 0:
                say(f"  iot.read {i + 1 - WARMUP_CALLS}/{calls}")
    return times, samples, refusals


async def direct_gets(controller: ControllerProcess, namespace: str, names: list[str], token: str, calls: int,
                      keep_alive: bool) -> tuple[list[float], list[int], int]:
    """GETs of the readings endpoint: (milliseconds, samples returned, bytes of the last answer). keep_alive:
    one session (connection) for all, as the gateway keeps one; else a session (and TLS handshake) each."""
    context = ssl.create_default_context(cafile=str(controller.serve_ca))
    headers = {"Authorization": f"Bearer {token}"}
    shared = aiohttp.ClientSession(headers=headers) if keep_alive else None
    times, samples, size = [], [], 0
    try:
        for i in range(WARMUP_CALLS + calls):
            url = readings_url(controller, namespace, names[i % len(names)])
            started = time.perf_counter()
            session = shared or aiohttp.ClientSession(headers=headers)
            try:
                async with session.get(url, params={"window_s": str(WINDOW_S)}, ssl=context) as response:
                    raw = await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"GET {url}: {response.status} {raw[:200]!r}")
                    body = await response.json()
            finally:
                if shared is None:
                    await session.close()
            elapsed = (time.perf_counter() - started) * 1000
            if i >= WARMUP_CALLS:
                times.append(elapsed)
                samples.append(sum(len(m.get("samples") or []) for m in body["metrics"].values()))
                size = len(raw)
    finally:
        if shared is not None:
            await shared.close()
    return times, samples, size


def latency(plane: Plane, calls: int, live_devices: int) -> dict[str, Any]:
    names = [f"bench-fan-{i}" for i in range(live_devices)]
    with agent_namespace(plane) as (admin, namespace, token), \
            readings_corral(plane, admin, namespace, dict.fromkeys(names, "env_fan")) as (url, controller):
        held_after = asyncio.run(wait_buffered(controller, namespace, names, token))
        say(f"  {calls} iot.read calls (window_s={WINDOW_S})")
        read, read_samples, refusals = asyncio.run(read_calls(url, token, [f"{namespace}/{n}" for n in names], calls))
        say(f"  {calls} direct GETs, one kept-alive connection")
        kept, kept_samples, size = asyncio.run(direct_gets(controller, namespace, names, token, calls, True))
        say(f"  {calls} direct GETs, a new connection each")
        fresh, _, _ = asyncio.run(direct_gets(controller, namespace, names, token, calls, False))
    if not read:
        raise RuntimeError(f"every iot.read was refused: {refusals[:5]}")
    return {
        "calls": calls, "live_devices": live_devices, "window_s": WINDOW_S, "telemetry_interval_s": 1.0,
        "seconds_until_buffer_held_window": round(held_after, 1),
        "iot_read": {**figures(read), "refused": len(refusals), "samples_per_call_min": min(read_samples),
                     "samples_per_call_median": statistics.median(read_samples),
                     "samples_per_call_max": max(read_samples)},
        "direct_get_keepalive": {**figures(kept), "samples_per_call_median": statistics.median(kept_samples),
                                 "response_bytes": size},
        "direct_get_new_connection": figures(fresh),
    }


# 2. Memory -------------------------------------------------------------------------------------------------


def fill(devices: int, seed: int = 1) -> list[SensorBuffer]:
    """`devices` buffers, each full: capacity samples of each metric, one a second, ending now."""
    rng = random.Random(seed)
    buffers = []
    for d in range(devices):
        buffer = SensorBuffer()
        start = int(time.time() * 1000) - buffer.capacity * 1000
        temperature, humidity = rng.uniform(18, 26), rng.uniform(35, 60)
        for i in range(buffer.capacity):
            ts = start + i * 1000 + rng.randrange(5)
            received = ts + rng.uniform(0.5, 3.0)
            temperature += rng.uniform(-0.05, 0.05)
            humidity += rng.uniform(-0.2, 0.2)
            for sample in (Sample(metric="temperature", value=round(temperature, 2), ts=ts),
                           Sample(metric="humidity", value=round(humidity, 1), ts=ts),
                           Sample(metric="rssi", value=rng.randint(-85, -45), ts=ts)):
                buffer.add(sample, received_ms=received)
        buffers.append(buffer)
        if (d + 1) % 250 == 0:
            say(f"    {d + 1}/{devices} buffers full")
    return buffers


def distinct_values(buffers: list[SensorBuffer]) -> float:
    """The share of values held that are objects of their own (not one object shared by many slots)."""
    ids: set[int] = set()
    total = 0
    for buffer in buffers[:50]:
        for ring in buffer.rings.values():
            values = list(ring._values)
            ids.update(id(v) for v in values)
            total += len(values)
    return len(ids) / total if total else 0.0


def memory(devices: int) -> dict[str, Any]:
    capacity = SensorBuffer().capacity
    samples = devices * capacity * len(METRICS)
    say(f"  memory: {devices} buffers x {len(METRICS)} metrics x {capacity} samples, RSS")
    gc.collect()
    rss_before = rss_mib(os.getpid())
    buffers = fill(devices)
    gc.collect()
    rss_delta = (rss_mib(os.getpid()) - rss_before) * 2**20
    del buffers
    gc.collect()
    say("  memory: the same again, under tracemalloc")
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    buffers = fill(devices)
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    held = sum(len(ring) for b in buffers for ring in b.rings.values())
    if held != samples:
        raise RuntimeError(f"the buffers hold {held} samples, not {samples}")
    distinct = distinct_values(buffers)
    per_1000 = 1000 / devices / 2**20
    return {
        "devices": devices, "metrics_per_device": len(METRICS), "capacity_samples_per_metric": capacity,
        "capacity_window_at_1hz_s": capacity, "samples_held": samples, "distinct_value_objects": round(distinct, 3),
        "tracemalloc_bytes_per_sample": round(traced / samples, 1),
        "tracemalloc_mib_per_1000_devices": round(traced * per_1000, 1),
        "tracemalloc_bytes_per_device": round(traced / devices),
        "rss_bytes_per_sample": round(rss_delta / samples, 1),
        "rss_mib_per_1000_devices": round(rss_delta * per_1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300, help="iot.read calls, and direct GETs of each kind")
    parser.add_argument("--live-devices", type=int, default=2, help="simulated env_fan devices at 1 Hz")
    parser.add_argument("--devices", type=int, default=1000, help="sensor buffers for the memory figure")
    parser.add_argument("--memory-only", action="store_true", help="only the memory figure (no plane)")
    parser.add_argument("--fresh-plane", action="store_true", help="a plane of its own, not `corral dev up`'s")
    args = parser.parse_args()
    result: dict[str, Any] = {}
    if not args.memory_only:
        with bench_plane(args.fresh_plane) as plane:
            result["latency"] = latency(plane, args.calls, args.live_devices)
    result["memory"] = memory(args.devices)

    if "latency" in result:
        lat = result["latency"]
        read, kept, fresh = lat["iot_read"], lat["direct_get_keepalive"], lat["direct_get_new_connection"]
        print(f"iot.read window_s={WINDOW_S} at 1 Hz ({len(METRICS)} metrics, {lat['live_devices']} devices, "
              f"{lat['calls']} calls, {read['refused']} refused): p50 {read['p50_ms']} ms, p90 {read['p90_ms']} ms, "
              f"p99 {read['p99_ms']} ms; samples per call {read['samples_per_call_median']:g} "
              f"(min {read['samples_per_call_min']}, max {read['samples_per_call_max']})")
        print(f"direct GET of the controller's readings, kept-alive connection: p50 {kept['p50_ms']} ms, "
              f"p90 {kept['p90_ms']} ms, p99 {kept['p99_ms']} ms ({kept['samples_per_call_median']:g} samples, "
              f"{kept['response_bytes']} bytes)")
        print(f"direct GET, a new connection each: p50 {fresh['p50_ms']} ms, "
              f"p90 {fresh['p90_ms']} ms, p99 {fresh['p99_ms']} ms")
    mem = result["memory"]
    print(f"sensor buffers: {mem['capacity_samples_per_metric']} samples per metric "
          f"({mem['capacity_window_at_1hz_s'] / 60:g} min at 1 Hz), {mem['metrics_per_device']} metrics, "
          f"{mem['devices']} devices full ({mem['distinct_value_objects'] * 100:.0f} % distinct value objects)")
    print(f"  tracemalloc: {mem['tracemalloc_bytes_per_sample']} bytes per sample, "
          f"{mem['tracemalloc_mib_per_1000_devices']} MiB per 1,000 devices")
    print(f"  RSS growth:  {mem['rss_bytes_per_sample']} bytes per sample, "
          f"{mem['rss_mib_per_1000_devices']} MiB per 1,000 devices")
    write_result("readings", result)


if __name__ == "__main__":
    main()

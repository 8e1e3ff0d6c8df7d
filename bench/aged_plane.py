"""The aged plane: control latency and throughput on a plane that has served N Intents, next to the same
plane fresh (issue 30's goal: within 15 % after 50,000 Intents, medians of 3 runs each).

One plane of its own, one pipeline (simulated lights, the controller with a short Intent retention so that
finished Intents are deleted as the product does, the HTTP gateway) for the whole run:

1. fresh: --runs runs of control_latency's measurement (sequential iot.control on one light, both floors)
   and of throughput's (--agents agents on --lights lights, both floors before and after), alternating;
2. fill: --intents Intents through the real path (--fill-agents MCP agents calling iot.control as fast as
   the pipeline answers), with progress; then it waits until retention has deleted the filled Intents;
3. aged: the same runs again;
4. the medians of each side and the difference in %.

The API server keeps what the product leaves behind (each Intent's outcome Event lives for the API
server's --event-ttl, an hour by default; deleted Intents leave tombstones until compaction): that is
what ages the plane.

    .venv/bin/python bench/aged_plane.py [--intents 50000] [--runs 3] [--retention 30]
    .venv/bin/python bench/aged_plane.py --intents 2000 --calls 100 --seconds 15
    .venv/bin/python bench/aged_plane.py --intents 500 --runs 1 --calls 50 --seconds 10   # does it work

The fill runs at the pipeline's throughput: 50,000 Intents take about 30 minutes at 29/s on a quiet
two-core machine, the measurements about 7 more. On a busy machine the second line above took 10 minutes
(the fill at 6.5/s), the third 2.5: figures to compare want a quiet one.

Writes bench/results/aged_plane-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

import control_latency
import throughput
from common import (
    Corral,
    CpuClock,
    agent_namespace,
    bench_plane,
    print_cpu,
    retention_args,
    running_corral,
    say,
    write_result,
)
from corral.devcluster.plane import Plane
from tests.gateway_harness import MODERN, http_client

FILL_PREFIX = "fill-"
# The figures compared: (run kind, the keys down to the figure, higher is better). The API server's CPU per
# Intent is the plainest sign of age (its cost grows with what it stores) and the one the other processes'
# share of a busy machine moves least.
COMPARED: list[tuple[str, tuple[str, ...], bool]] = [
    ("latency", ("control_p50_ms",), False), ("latency", ("control_p99_ms",), False),
    ("latency", ("kube_floor_p50_ms",), False), ("latency", ("mqtt_p50_ms",), False),
    ("latency", ("cpu", "kube-apiserver", "cpu_ms_per_intent"), False),
    ("throughput", ("intents_per_s",), True), ("throughput", ("latency_p50_ms",), False),
    ("throughput", ("latency_p99_ms",), False),
    ("throughput", ("cpu", "kube-apiserver", "cpu_ms_per_intent"), False),
    ("throughput", ("cpu", "controller (corral run)", "cpu_ms_per_intent"), False),
]


class Fill:
    """Progress of the fill, shared by its agents."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.claimed = 0
        self.codes: list[str] = []
        self.started = time.monotonic()

    def claim(self) -> bool:
        if self.claimed >= self.total:
            return False
        self.claimed += 1
        return True

    def line(self, rate_now: float) -> str:
        done, elapsed = len(self.codes), time.monotonic() - self.started
        mean = done / elapsed if elapsed else 0.0
        left = (self.total - done) / mean if mean else float("nan")
        return (f"  fill: {done}/{self.total} Intents ({self.codes.count('EXECUTED')} EXECUTED), "
                f"{rate_now:.1f}/s now, {mean:.1f}/s mean, about {left:.0f} s left")


async def fill_agent(url: str, token: str, lights: list[str], fill: Fill) -> None:
    async with http_client(url, token, mode=MODERN) as client:
        await client.list_tools()
        i = 0
        while fill.claim():
            args = {"device_id": lights[i % len(lights)], "actuator": "power", "action": "set_state",
                    "params": {"value": (i // len(lights)) % 2 == 0}, "reason": "aged plane fill",
                    "request_id": f"{FILL_PREFIX}{uuid.uuid4().hex[:12]}"}
            try:
                result = await client.call_tool("iot.control", args)
            except Exception as err:  # noqa: BLE001 - one failed call of 50,000 is counted, not the end of the fill
                fill.codes.append(f"error: {type(err).__name__}")
            else:
                fill.codes.append((result.structured_content or {}).get("code", "error"))
            i += 1


async def report_progress(fill: Fill, every_s: float = 5.0) -> None:
    last_done, last_at = 0, time.monotonic()
    while True:
        await asyncio.sleep(every_s)
        now, done = time.monotonic(), len(fill.codes)
        say(fill.line((done - last_done) / (now - last_at)))
        last_done, last_at = done, now


async def run_fill(url: str, token: str, lights: list[str], agents: int, fill: Fill) -> None:
    progress = asyncio.ensure_future(report_progress(fill))
    try:
        await asyncio.gather(*(fill_agent(url, token, lights[i::agents], fill) for i in range(agents)))
    finally:
        progress.cancel()


def intents_left(admin: Any, namespace: str) -> tuple[int, int]:
    """(all Intents in the namespace, those the fill made)."""
    import kubernetes

    items = kubernetes.client.CustomObjectsApi(admin).list_namespaced_custom_object(
        "corral.dev", "v1alpha1", namespace, "intents")["items"]
    return len(items), sum(1 for i in items if i["metadata"]["name"].startswith(FILL_PREFIX))


def wait_retained(admin: Any, namespace: str, timeout_s: float) -> dict[str, Any]:
    """Wait until retention has deleted every filled Intent: the aged plane is measured as it is once the
    burst is over, not while the controller is still deleting it."""
    started, last = time.monotonic(), -1
    while True:
        total, filled = intents_left(admin, namespace)
        if filled != last:
            say(f"  retention: {filled} filled Intents left ({total} in the namespace)")
            last = filled
        if filled == 0 or time.monotonic() - started > timeout_s:
            if filled:
                say(f"  retention left {filled} filled Intents after {timeout_s:.0f} s; measuring anyway")
            return {"waited_s": round(time.monotonic() - started, 1), "filled_intents_left": filled,
                    "intents_in_namespace": total}
        time.sleep(2)


def events_in(admin: Any, namespace: str) -> int:
    import kubernetes

    return len(kubernetes.client.CoreV1Api(admin).list_namespaced_event(namespace).items)


def runs(plane: Plane, namespace: str, corral: Corral, token: str, lights: list[str], args: argparse.Namespace,
         side: str) -> dict[str, list[dict[str, Any]]]:
    """--runs runs of each measurement, alternating, so that the machine's drift hits both alike."""
    done: dict[str, list[dict[str, Any]]] = {"latency": [], "throughput": []}
    for run in range(args.runs):
        say(f"{side} plane, run {run + 1}/{args.runs}: control latency")
        done["latency"].append(control_latency.measure(plane, namespace, corral, token, args.calls, lights[0]))
        control_latency.report(done["latency"][-1])
        say(f"{side} plane, run {run + 1}/{args.runs}: throughput")
        done["throughput"].append(throughput.measure(plane, namespace, corral, token, lights, args.agents,
                                                     args.seconds, args.floor_calls))
        throughput.report(done["throughput"][-1])
    return done


def compare(fresh: dict[str, list[dict[str, Any]]], aged: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The median of each side and the difference in % (positive: the aged plane is worse)."""
    def figure(run: dict[str, Any], keys: tuple[str, ...]) -> float:
        value: Any = run
        for key in keys:
            value = value[key]
        return float(value)

    rows = {}
    for kind, keys, higher_is_better in COMPARED:
        a = statistics.median(figure(r, keys) for r in fresh[kind])
        b = statistics.median(figure(r, keys) for r in aged[kind])
        change = (b - a) / a * 100 if a else float("nan")
        rows[f"{kind}: {' '.join(keys)}"] = {"fresh": round(a, 2), "aged": round(b, 2),
                                             "worse_pct": round(-change if higher_is_better else change, 1)}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--intents", type=int, default=50_000, help="Intents the fill serves")
    parser.add_argument("--fill-agents", type=int, default=16, help="concurrent MCP agents of the fill")
    parser.add_argument("--retention", type=float, default=30, help="seconds a finished Intent is kept")
    parser.add_argument("--runs", type=int, default=3, help="runs of each measurement on each side")
    parser.add_argument("--calls", type=int, default=200, help="sequential iot.control calls of a latency run")
    parser.add_argument("--agents", type=int, default=8, help="agents of a throughput run")
    parser.add_argument("--lights", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=30, help="length of a throughput run")
    parser.add_argument("--floor-calls", type=int, default=50, help="round trips of each floor around a throughput run")
    args = parser.parse_args()
    if not 1 <= args.fill_agents <= args.lights or not 1 <= args.agents <= args.lights:
        parser.error(f"--fill-agents and --agents must be between 1 and --lights ({args.lights}): each agent "
                     "drives lights of its own")
    lights = [f"light-{i:03d}" for i in range(args.lights)]
    result: dict[str, Any] = {"intents": args.intents, "fill_agents": args.fill_agents, "retention_s": args.retention,
                              "runs": args.runs, "calls": args.calls, "agents": args.agents, "lights": args.lights,
                              "seconds": args.seconds}
    with bench_plane(fresh=True) as plane, agent_namespace(plane) as (admin, namespace, token), \
            running_corral(plane, admin, namespace, dict.fromkeys(lights, "light"),
                           *retention_args(args.retention)) as corral:
        fresh = runs(plane, namespace, corral, token, lights, args, "fresh")
        say(f"fill: {args.intents} Intents with {args.fill_agents} agents")
        fill = Fill(args.intents)
        cpu_before = corral.cpu.read()
        asyncio.run(run_fill(corral.url, token, lights, args.fill_agents, fill))
        elapsed = time.monotonic() - fill.started
        executed = fill.codes.count("EXECUTED")
        result["fill"] = {"seconds": round(elapsed, 1), "executed": executed,
                          "other_codes": sorted({c for c in fill.codes if c != "EXECUTED"}),
                          "intents_per_s": round(len(fill.codes) / elapsed, 1),
                          "cpu": CpuClock.per_intent(cpu_before, corral.cpu.read(), executed, elapsed)}
        say(fill.line(result["fill"]["intents_per_s"]))
        print_cpu(result["fill"]["cpu"], executed)
        result["retention"] = wait_retained(admin, namespace, args.retention + 300)
        result["retention"]["events_in_namespace"] = events_in(admin, namespace)
        aged = runs(plane, namespace, corral, token, lights, args, "aged")
    result |= {"fresh": fresh, "aged": aged, "compared": compare(fresh, aged)}
    print(f"Fill: {executed}/{args.intents} EXECUTED in {result['fill']['seconds']} s "
          f"({result['fill']['intents_per_s']}/s; 50,000 would take about "
          f"{50_000 / result['fill']['intents_per_s'] / 60:.0f} min at this rate); then "
          f"{result['retention']['filled_intents_left']} filled Intents left after {result['retention']['waited_s']} s, "
          f"{result['retention']['events_in_namespace']} Events in the namespace")
    print(f"Medians of {args.runs} runs, fresh plane -> after {args.intents} Intents (worse by):")
    for name, row in result["compared"].items():
        print(f"  {name}: {row['fresh']} -> {row['aged']} ({row['worse_pct']:+.1f} %)")
    write_result("aged_plane", result)


if __name__ == "__main__":
    main()

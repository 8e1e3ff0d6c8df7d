"""Scale: 1, 2 and 3 controller replicas (`--leader-elect --shards 12`) over 1,000 / 5,000 / 10,000 simulated devices.

For each size and replica count, on a namespace and a broker of the run's own: the devices are enrolled (Devices
and Secrets, a few at a time), the broker starts with every device's account already in its dynamic-security
state (written in one go before it starts: made one by one through the plugin, 5,000 accounts take about 700 s,
since the plugin rewrites its whole state file after each), the fleet connects (real firmware, telemetry every
`--telemetry` s), then the replicas start, each on a broker account of its own (corral-controller-1..3). Reported:

- time to ready: from the replicas' start until every shard Lease is held and every Device is online and inSync;
- per replica, over a steady window of `--window` s after ready: CPU (its own accounting in /proc, in % of one
  core) and RSS at the end, and the shards it holds;
- status writes per second to Devices (the API server's own counters) in that window;
- iot.control -> EXECUTED p50/p99 through the HTTP gateway during that window, on devices spread over every shard.

    .venv/bin/python bench/scale.py [--sizes 1000,5000] [--replicas 1,3] [--window 60] [--calls 60]

On two cores the point is the cost per replica, not a speed-up: every replica, the API server, the broker and
the simulator (one thread of this process) share them. Writes bench/results/scale-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from common import CpuClock, agent_namespace, api_requests, bench_plane, percentile, say, write_result
from corral.devcluster.plane import Plane
from tests.controller_harness import ControllerProcess
from tests.fleet_harness import running_fleet
from tests.gateway_harness import MODERN, HttpGateway, http_client
from tests.harness import rss_mib, wait_for
from tests.sharding_harness import broker_with_accounts, enroll_many

SHARDS = 12
REPLICA_ACCOUNTS = ["corral-controller-1", "corral-controller-2", "corral-controller-3"]


def shard_holders(admin: Any, namespace: str, lease_prefix: str) -> dict[int, str]:
    import kubernetes

    leases = kubernetes.client.CoordinationV1Api(admin).list_namespaced_lease(namespace).items
    return {int(lease.metadata.name.rsplit("-", 1)[1]): lease.spec.holder_identity or ""
            for lease in leases if lease.metadata.name.startswith(f"{lease_prefix}-shard-")}


def ready_devices(admin: Any, namespace: str) -> int:
    import kubernetes

    items = kubernetes.client.CustomObjectsApi(admin).list_namespaced_custom_object(
        "corral.dev", "v1alpha1", namespace, "devices")["items"]
    return sum(1 for i in items if (i.get("status") or {}).get("online") and (i.get("status") or {}).get("inSync"))


def status_writes(plane: Plane) -> int:
    counts = api_requests(plane)
    return sum(n for (verb, resource, sub), n in counts.items()
               if resource == "devices" and sub == "status" and verb in ("APPLY", "PATCH", "UPDATE"))


async def control_calls(url: str, token: str, devices: list[str], calls: int, seconds: float
                        ) -> tuple[list[float], list[str]]:
    """iot.control on `calls` devices in turn, spread over the window (not back to back: latency under the
    fleet's load, not under our own)."""
    times, codes = [], []
    gap = seconds / max(calls, 1)
    async with http_client(url, token, mode=MODERN) as client:
        # The gateway offers iot.control once it sees a device it may drive (its first listing, on a busy machine).
        deadline = time.monotonic() + 120
        while "iot.control" not in {tool.name for tool in (await client.list_tools()).tools}:
            if time.monotonic() > deadline:
                raise AssertionError("the gateway never offered iot.control")
            await asyncio.sleep(1)
        for i in range(calls):
            started = time.perf_counter()
            args = {"device_id": devices[i % len(devices)], "actuator": "power", "action": "set_state",
                    "params": {"value": (i // len(devices)) % 2 == 0}, "reason": "scale benchmark",
                    "request_id": f"scale-{uuid.uuid4().hex[:12]}"}
            result = await client.call_tool("iot.control", args)
            elapsed = time.perf_counter() - started
            times.append(elapsed * 1000)
            codes.append((result.structured_content or {}).get("code", "error"))
            await asyncio.sleep(max(0.0, gap - elapsed))
    return times, codes


def one_run(plane: Plane, size: int, replicas: int, args: argparse.Namespace) -> dict[str, Any]:
    from corral.scale.hashing import shard_of

    names = [f"d{i:05d}" for i in range(size)]
    with agent_namespace(plane) as (admin, namespace, token), tempfile.TemporaryDirectory() as work:
        # The replicas' and gateway's logs: kept under --logs (one directory per run) to read after a failure.
        logs = Path(tempfile.mkdtemp(prefix=f"scale-{size}x{replicas}-", dir=args.logs)) if args.logs else Path(work)
        prefix = f"scale-{uuid.uuid4().hex[:6]}"
        started = time.monotonic()
        passwords = enroll_many(admin, namespace, dict.fromkeys(names, "light"))
        enrolled_s = time.monotonic() - started
        say(f"  {size} devices enrolled in {enrolled_s:.0f} s")
        with broker_with_accounts(logs / "broker", prefix, passwords) as prebuilt:
            ours = prebuilt.plane(plane)
            with running_fleet(ours, prefix, dict.fromkeys(names, "light"), credentials=passwords,
                               telemetry_interval_s=args.telemetry, connect_spread_s=size / 500):
                time.sleep(size / 500 + 2)  # the fleet is connected before the replicas start
                lease_prefix = f"scale-{uuid.uuid4().hex[:6]}"
                controllers = [
                    ControllerProcess(ours, namespace, prefix, logs / f"replica-{r}.log",
                                      "--leader-elect", "--shards", str(SHARDS), "--lease-prefix", lease_prefix,
                                      "--lease-namespace", namespace, "--identity", f"bench-r{r}_{secrets.token_hex(4)}",
                                      mqtt_url=prebuilt.controller_url(REPLICA_ACCOUNTS[r]),
                                      checkpoint=f"corral-controller-r{r}")
                    for r in range(replicas)
                ]
                gateway = None
                try:
                    began = time.monotonic()
                    for controller in controllers:
                        controller.start()
                    wait_for(lambda: len([h for h in shard_holders(admin, namespace, lease_prefix).values() if h])
                             == SHARDS, "every shard held", timeout_s=120, interval_s=0.5)
                    shards_s = time.monotonic() - began
                    last = [-1]

                    def all_ready() -> bool:
                        ready = ready_devices(admin, namespace)
                        if ready != last[0]:
                            say(f"  {ready}/{size} devices online and inSync")
                            last[0] = ready
                        return ready >= size

                    wait_for(all_ready, f"all {size} devices online and inSync", timeout_s=60 + size / 5,
                             interval_s=2.0)
                    ready_s = time.monotonic() - began
                    gateway = HttpGateway(ours, namespace, logs / "gateway.log", "--rate-limit", "0/1")
                    clock = CpuClock()
                    for r, controller in enumerate(controllers):
                        clock.add_process(f"replica {r}", controller.pid)
                    clock.add_process("broker", prebuilt.pid)
                    # Two devices per shard, in turn: every replica serves calls.
                    spread: dict[int, list[str]] = {}
                    for name in names:
                        spread.setdefault(shard_of(name, SHARDS), []).append(name)
                    targets = [d for k in sorted(spread) for d in spread[k][:2]]
                    say(f"  steady window of {args.window:g} s with {args.calls} iot.control calls")
                    cpu_before, writes_before, window_start = clock.read(), status_writes(plane), time.monotonic()
                    times, codes = asyncio.run(control_calls(gateway.url, token, targets, args.calls, args.window))
                    seconds = time.monotonic() - window_start
                    cpu_after, writes_after = clock.read(), status_writes(plane)
                    holders = shard_holders(admin, namespace, lease_prefix)
                    per_replica = [{
                        "replica": r, "cpu_pct_of_core": round(100 * (cpu_after[f"replica {r}"]
                                                                      - cpu_before[f"replica {r}"]) / seconds, 1),
                        "rss_mib": round(rss_mib(c.pid)),
                        "shards": sum(1 for h in holders.values() if h.startswith(f"bench-r{r}_")),
                    } for r, c in enumerate(controllers)]
                finally:
                    if gateway is not None:
                        gateway.stop()
                    for controller in controllers:
                        if controller.proc is not None:
                            controller.stop()
    return {"devices": size, "replicas": replicas, "enroll_s": round(enrolled_s), "shards_held_s": round(shards_s, 1),
            "ready_s": round(ready_s, 1), "window_s": round(seconds, 1), "per_replica": per_replica,
            "broker_cpu_pct_of_core": round(100 * (cpu_after["broker"] - cpu_before["broker"]) / seconds, 1),
            "status_writes_per_s": round((writes_after - writes_before) / seconds, 1),
            "control_executed": codes.count("EXECUTED"), "control_calls": len(codes),
            "control_p50_ms": round(statistics.median(times), 1), "control_p99_ms": round(percentile(times, 0.99), 1)}


def table(runs: list[dict[str, Any]]) -> str:
    lines = ["| devices | replicas | ready (s) | CPU per replica (% of a core) | RSS per replica (MiB) | "
             "status writes/s | iot.control p50 / p99 (ms) | broker CPU (%) |", "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        if "failed" in run:
            lines.append(f"| {run['devices']:,} | {run['replicas']} | did not finish: {run['failed'][:160]} |||||")
            continue
        cpu = ", ".join(f"{r['cpu_pct_of_core']:g}" for r in run["per_replica"])
        rss = ", ".join(f"{r['rss_mib']}" for r in run["per_replica"])
        lines.append(f"| {run['devices']:,} | {run['replicas']} | {run['ready_s']:g} | {cpu} | {rss} | "
                     f"{run['status_writes_per_s']:g} | {run['control_p50_ms']:g} / {run['control_p99_ms']:g} "
                     f"({run['control_executed']}/{run['control_calls']} EXECUTED) | {run['broker_cpu_pct_of_core']:g} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,5000,10000")
    parser.add_argument("--replicas", default="1,2,3")
    parser.add_argument("--window", type=float, default=60.0, help="seconds of steady state measured after ready")
    parser.add_argument("--calls", type=int, default=60, help="iot.control calls spread over the window")
    parser.add_argument("--telemetry", type=float, default=10.0, help="seconds between a device's telemetry")
    parser.add_argument("--logs", type=Path, help="keep each run's logs (replicas, gateway, broker) under this directory")
    parser.add_argument("--fresh-plane", action="store_true", help="a plane of its own, not `corral dev up`'s")
    args = parser.parse_args()
    runs = []
    with bench_plane(args.fresh_plane) as plane:
        for size in (int(s) for s in args.sizes.split(",")):
            for replicas in (int(r) for r in args.replicas.split(",")):
                say(f"{size} devices, {replicas} replica(s)")
                try:
                    runs.append(one_run(plane, size, replicas, args))
                except Exception as err:  # noqa: BLE001 - a size this machine does not carry: say where it stopped, go on
                    runs.append({"devices": size, "replicas": replicas, "failed": str(err)[:500]})
                say(f"  {runs[-1]}")
    print(table(runs))
    write_result("scale", {"shards": SHARDS, "telemetry_interval_s": args.telemetry, "runs": runs})


if __name__ == "__main__":
    main()

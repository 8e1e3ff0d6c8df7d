"""End-to-end latency of a low-risk write: Intent created -> decided -> device ack -> EXECUTED.

Real parts only: the local kube-apiserver, Mosquitto, the controller as its
own process (`corral run`) and one simulated light (real firmware). An
agent identity (a ServiceAccount with the agent-operator rules) submits N Intents
one after another, alternating the light's power, and the time from create to
the client seeing EXECUTED is recorded.

    .venv/bin/python bench/intent_latency.py [--runs 100]

Reuses the plane of `corral dev up` in this checkout if it runs, else starts one.
Prints the figures and writes bench/results/intent_latency-<time>.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from common import agent_namespace, bench_plane, percentile, wait_registered, write_result
from corral.client.intents import submit, wait_settled
from tests.controller_harness import ControllerProcess
from tests.fleet_harness import running_fleet
from tests.harness import api_client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()

    with bench_plane() as plane, agent_namespace(plane) as (admin, namespace, token):
        operator = api_client(plane, token=token)
        requester = f"system:serviceaccount:{namespace}:agent"
        prefix = f"bench-{uuid.uuid4().hex[:6]}"
        with tempfile.TemporaryDirectory() as logs, running_fleet(plane, prefix, {"bench-light": "light"}, enroll_in=(admin, namespace)):
            controller = ControllerProcess(plane, namespace, prefix, Path(logs) / "controller.log")
            controller.start()
            try:
                wait_registered(admin, namespace, 1)
                latencies, codes = [], []
                for run in range(args.runs):
                    spec = {"device": "bench-light", "actuator": "power", "action": "set_state",
                            "params": {"value": run % 2 == 0}, "reason": "latency benchmark", "requester": requester}
                    name = f"bench-{run:04d}-{uuid.uuid4().hex[:4]}"
                    started = time.perf_counter()
                    submit(operator, namespace, name, spec)
                    final = wait_settled(operator, namespace, name, timeout_s=10, poll_s=0.005)
                    latencies.append(time.perf_counter() - started)
                    codes.append((final.get("status") or {}).get("code"))
            finally:
                controller.stop()
        executed = codes.count("EXECUTED")
        result = {
            "runs": args.runs,
            "executed": executed,
            "median_ms": round(statistics.median(latencies) * 1000, 1),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
            "min_ms": round(min(latencies) * 1000, 1),
            "max_ms": round(max(latencies) * 1000, 1),
        }
        print(f"low-risk write, Intent created -> EXECUTED seen by the client, {args.runs} runs "
              f"({executed} EXECUTED): median {result['median_ms']} ms, p99 {result['p99_ms']} ms "
              f"(min {result['min_ms']}, max {result['max_ms']})")
        write_result("intent_latency", result)


if __name__ == "__main__":
    main()

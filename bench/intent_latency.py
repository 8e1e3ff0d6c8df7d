"""End-to-end latency of a low-risk write: Intent created -> decided -> device ack -> EXECUTED.

Real parts only: the local kube-apiserver, Mosquitto, the controller as its
own process (`corral run`) and one simulated light (real firmware). An
operator identity (a ServiceAccount with the `write` verb) submits N Intents
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

from common import REPO, bench_plane, percentile, write_result

import kubernetes  # noqa: E402

from corral.client.intents import submit, wait_settled  # noqa: E402
from tests.controller_harness import ControllerProcess, device  # noqa: E402
from tests.fleet_harness import running_fleet  # noqa: E402
from tests.harness import api_client, apply_yaml, service_account_token, wait_for, wait_until_allowed  # noqa: E402

ROLE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: operator}
rules:
- {apiGroups: [corral.dev], resources: [devices], verbs: [get, write]}
- {apiGroups: [corral.dev], resources: [intents], verbs: [create, get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: operator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: operator}
subjects: [{kind: ServiceAccount, name: operator, namespace: NAMESPACE}]
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()

    with bench_plane() as plane:
        admin = api_client(plane)
        for path in sorted((REPO / "crds").glob("*.yaml")):
            apply_yaml(admin, path.read_text(), field_manager="corral-install", force=True)
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        kubernetes.client.CoreV1Api(admin).create_namespace({"metadata": {"name": namespace}})
        apply_yaml(admin, ROLE.replace("NAMESPACE", namespace), namespace)
        operator = api_client(plane, token=service_account_token(admin, namespace, "operator"))
        wait_until_allowed(operator, "write", namespace, "devices")
        requester = f"system:serviceaccount:{namespace}:operator"
        prefix = f"bench-{uuid.uuid4().hex[:6]}"
        with tempfile.TemporaryDirectory() as logs, running_fleet(plane, prefix, {"bench-light": "light"}):
            controller = ControllerProcess(plane, namespace, prefix, Path(logs) / "controller.log")
            controller.start()
            try:
                wait_for(lambda: (device(admin, namespace, "bench-light").get("status") or {}).get("inSync"),
                         "the light registered", timeout_s=30)
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

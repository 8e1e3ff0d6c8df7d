"""What the benchmarks share: a control plane to run on, percentiles, and where results go."""

from __future__ import annotations

import json
import platform
import re
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO))

from corral.devcluster.plane import DevPlane, Plane  # noqa: E402


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextmanager
def bench_plane(fresh: bool = False) -> Iterator[Plane]:
    """The plane of `corral dev up` in this checkout if it runs (unless `fresh`), else a fresh one removed
    afterwards. A plane that has served many test runs holds thousands of objects, and the API server pays
    for them on every request (garbage collection): figures to compare come from a fresh plane."""
    plane = None if fresh else DevPlane(REPO / ".corral" / "dev", progress=say).running()
    if plane is not None:
        yield plane
        return
    own = DevPlane(Path(tempfile.mkdtemp(prefix="corral-bench-")), progress=say)
    try:
        yield own.up()
    finally:
        own.down(purge=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def write_result(name: str, result: dict[str, Any]) -> Path:
    result = {"benchmark": name, **result,
              "machine": f"{platform.machine()}, {platform.system()} {platform.release()}, "
                         f"Python {platform.python_version()}",
              "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return path


@contextmanager
def agent_namespace(plane: Plane) -> Iterator[tuple[Any, str, str]]:
    """A fresh namespace with Corral's CRDs installed and an agent ServiceAccount allowed to read and
    write devices and read contracts: (admin client, namespace, the agent's token)."""
    import kubernetes

    from corral.client.install import install_api
    from tests.gateway_harness import capabilities_readable, grant_agent
    from tests.harness import api_client

    admin = api_client(plane)
    install_api(admin)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    kubernetes.client.CoreV1Api(admin).create_namespace({"metadata": {"name": namespace}})
    token = grant_agent(plane, admin, namespace)
    with capabilities_readable(admin, namespace, "agent"):
        yield admin, namespace, token


def wait_registered(admin: Any, namespace: str, count: int, timeout_s: float = 300) -> float:
    """Seconds until `count` Devices are online with a contract (progress to stderr)."""
    import kubernetes

    objects = kubernetes.client.CustomObjectsApi(admin)
    started = time.monotonic()
    last = -1
    while True:
        items = objects.list_namespaced_custom_object("corral.dev", "v1alpha1", namespace, "devices")["items"]
        ready = sum(1 for i in items if (i.get("status") or {}).get("online") and (i.get("status") or {}).get("capability"))
        if ready != last:
            say(f"  {ready}/{count} devices registered")
            last = ready
        if ready >= count:
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"only {ready}/{count} devices registered after {timeout_s:.0f} s")
        time.sleep(1)


@contextmanager
def running_corral(plane: Plane, admin: Any, namespace: str, devices: dict[str, str],
                   *controller_args: str, tls: bool = False) -> Iterator[tuple[str, str]]:
    """Simulated devices (id -> type), the controller and the HTTP gateway (no rate limit) on the plane, all
    devices registered: (the gateway's URL, the topic prefix). `tls`: devices and controller over mqtts://."""
    from tests.controller_harness import ControllerProcess
    from tests.fleet_harness import running_fleet
    from tests.gateway_harness import HttpGateway

    prefix = f"bench-{uuid.uuid4().hex[:6]}"
    if tls:
        from corral.devcluster.files import BROKER_CONTROLLER

        controller_args = (*plane.mqtt_args_as(BROKER_CONTROLLER, tls=True), "--mqtt-ca",
                           str(plane.mqtt_ca_file), *controller_args)
    with tempfile.TemporaryDirectory() as logs, \
            running_fleet(plane, prefix, devices, enroll_in=(admin, namespace), tls=tls):
        controller = ControllerProcess(plane, namespace, prefix, Path(logs) / "controller.log", *controller_args)
        controller.start()
        gateway = None
        try:
            wait_registered(admin, namespace, len(devices))
            gateway = HttpGateway(plane, namespace, Path(logs) / "gateway.log", "--rate-limit", "0/1")
            yield gateway.url, prefix
        finally:
            if gateway is not None:
                gateway.stop()
            controller.stop()


def api_requests(plane: Plane) -> Counter[tuple[str, str, str]]:
    """The API server's own request counters (`apiserver_request_total`) by (verb, resource, subresource)."""
    import ssl
    import urllib.request

    request = urllib.request.Request(plane.server + "/metrics", headers={"Authorization": f"Bearer {plane.admin_token}"})
    context = ssl.create_default_context(cafile=str(plane.ca_file))
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        body = response.read().decode()
    counts: Counter[tuple[str, str, str]] = Counter()
    for line in body.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
            counts[key] += int(float(line.rsplit(" ", 1)[1]))
    return counts


def requests_per(before: Counter[tuple[str, str, str]], after: Counter[tuple[str, str, str]], count: int,
                 least: float = 0.05) -> dict[str, float]:
    """Requests per unit of work between two readings, by "VERB resource[/subresource]" (the frequent ones)."""
    per = {f"{verb} {resource}{'/' + sub if sub else ''}": (after[key] - before.get(key, 0)) / count
           for key in after for verb, resource, sub in [key] if after[key] - before.get(key, 0) > 0}
    return {k: round(v, 2) for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= least}


async def kubernetes_floor(plane: Plane, namespace: str, count: int) -> list[float]:
    """The Kubernetes floor: create a plain object (a ConfigMap) and see it in a watch, in milliseconds.

    The same API server, credentials and client (kube/client.py) the controller uses; one object after
    another, each timed from the create's start to its ADDED event on a watch opened beforehand.
    """
    import asyncio

    import kubernetes

    from corral.kube.client import AsyncApi, path_of

    config = kubernetes.client.Configuration()
    config.host, config.ssl_ca_cert = plane.server, str(plane.ca_file)
    config.api_key = {"authorization": f"Bearer {plane.admin_token}"}
    api = AsyncApi(config)
    collection = path_of("", "v1", "configmaps", namespace)
    seen: dict[str, float] = {}
    arrived = asyncio.Event()
    try:
        version = (await api.request("GET", collection, params={"limit": "1"}))["metadata"]["resourceVersion"]

        async def watch() -> None:
            async for event in api.watch(collection, {"resourceVersion": version, "timeoutSeconds": "300"}, 300):
                if event.get("type") == "ADDED":
                    seen[event["object"]["metadata"]["name"]] = time.perf_counter()
                    arrived.set()

        watcher = asyncio.ensure_future(watch())
        await asyncio.sleep(0.5)  # the watch is open before the first create
        times = []
        for i in range(count):
            name = f"floor-{uuid.uuid4().hex[:10]}"
            arrived.clear()
            started = time.perf_counter()
            await api.request("POST", collection, body={"metadata": {"name": name}, "data": {"i": str(i)}})
            while name not in seen:
                await asyncio.wait_for(arrived.wait(), 10)
                arrived.clear()
            times.append((seen[name] - started) * 1000)
        watcher.cancel()
        return times
    finally:
        await api.close()

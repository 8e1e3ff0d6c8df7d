"""What the benchmarks share: a control plane to run on, percentiles, and where results go."""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
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


class CpuClock:
    """The CPU time (user + system) of processes and threads, each read from its own accounting in /proc:
    what a process spent, whatever machine-wide load there was beside it."""

    def __init__(self) -> None:
        self.stat_files: dict[str, Path] = {}

    def add_process(self, name: str, pid: int) -> None:
        self.stat_files[name] = Path(f"/proc/{pid}/stat")

    def add_thread(self, name: str, native_id: int) -> None:
        self.stat_files[name] = Path(f"/proc/{os.getpid()}/task/{native_id}/stat")

    def read(self) -> dict[str, float]:
        """Seconds of CPU so far, by name."""
        return {name: _cpu_seconds(path) for name, path in self.stat_files.items()}

    @staticmethod
    def per_intent(before: dict[str, float], after: dict[str, float], intents: int, seconds: float
                   ) -> dict[str, dict[str, float]]:
        """By name: ms of CPU per Intent executed in the window, and the cores it kept busy on average."""
        return {name: {"cpu_ms_per_intent": round((after[name] - before[name]) * 1000 / max(intents, 1), 2),
                       "cores": round((after[name] - before[name]) / max(seconds, 1e-9), 2)}
                for name in before if name in after}


def _cpu_seconds(stat: Path) -> float:
    # The command name (field 2) is in parentheses and may hold spaces: count the fields after its ")".
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def print_cpu(cpu: dict[str, dict[str, float]], intents: int) -> None:
    print(f"CPU per Intent ({intents} EXECUTED in the window), each process's own accounting:")
    for name, figures in sorted(cpu.items(), key=lambda item: -item[1]["cpu_ms_per_intent"]):
        print(f"  {name}: {figures['cpu_ms_per_intent']} ms ({figures['cores']} cores)")


def plane_clock(plane: Plane) -> CpuClock:
    """A CpuClock on the plane's API server and broker, and on this process's firmware simulator thread if one
    runs (the benchmark's own client is the rest of this process)."""
    from corral.devcluster.plane import APISERVER, BROKER

    clock = CpuClock()
    pids = {status.name: status.pid for status in DevPlane(plane.state_dir, progress=say).status()}
    for name, label in ((APISERVER, "kube-apiserver"), (BROKER, "mosquitto")):
        pid = pids.get(name)
        if pid is not None:
            clock.add_process(label, pid)
    clock.add_process("bench process (agents, firmware)", os.getpid())
    for thread in threading.enumerate():
        if thread.name == "fleet" and thread.native_id is not None:
            clock.add_thread("firmware simulator (its thread)", thread.native_id)
    return clock


def retention_args(seconds: float) -> list[str]:
    """`corral run`'s option that deletes finished Intents after `seconds`: --intent-retention (issue 30), or
    --intent-ttl for a controller older than it, whichever the installed `corral run` knows."""
    import subprocess

    from tests.controller_harness import CORRAL

    usage = subprocess.run([CORRAL, "run", "--help"], capture_output=True, text=True, check=True).stdout
    flag = "--intent-retention" if "--intent-retention" in usage else "--intent-ttl"
    return [flag, f"{seconds:g}"]


@dataclass
class Corral:
    """The controller and gateway running_corral started: the gateway's URL, the topic prefix, and a clock on
    every process of the pipeline."""

    url: str
    prefix: str
    cpu: CpuClock = field(default_factory=CpuClock)

    def __iter__(self) -> Iterator[str]:
        # `with running_corral(...) as (url, prefix):` was its form before it had a clock; it still works.
        return iter((self.url, self.prefix))


@contextmanager
def running_corral(plane: Plane, admin: Any, namespace: str, devices: dict[str, str],
                   *controller_args: str, tls: bool = False) -> Iterator[Corral]:
    """Simulated devices (id -> type), the controller and the HTTP gateway (no rate limit) on the plane, all
    devices registered. `tls`: devices and controller over mqtts://. Its CpuClock reads the API server,
    `corral run`, `corral mcp`, the broker and the firmware simulator."""
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
            clock = plane_clock(plane)
            clock.add_process("controller (corral run)", controller.pid)
            clock.add_process("gateway (corral mcp)", gateway.proc.pid)
            yield Corral(gateway.url, prefix, clock)
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


def mqtt_floor(plane: Plane, prefix: str, device: str, calls: int, tls: bool = False) -> list[float]:
    """The MQTT floor: a `get_state` command published straight to a device and its ack, in milliseconds.

    The device acks with its state and changes nothing. The raw client logs in with an account of its own
    and, like the firmware and the controller, sends small packets at once (TCP_NODELAY)."""
    import paho.mqtt.client as mqtt

    from tests.broker_harness import observer

    acked: dict[str, float] = {}
    arrived = threading.Condition()

    def on_message(_c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        ack = json.loads(message.payload)
        with arrived:
            acked[ack.get("id")] = time.perf_counter()
            arrived.notify_all()

    username, password = observer(plane, "raw")
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=username, protocol=mqtt.MQTTv5)
    client.username_pw_set(username, password)
    if tls:
        client.tls_set_context(ssl.create_default_context(cafile=str(plane.mqtt_ca_file)))
    client.on_message = on_message
    client.on_socket_open = lambda _c, _u, sock: sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    subscribed = threading.Event()
    client.on_subscribe = lambda *_: subscribed.set()
    client.connect("127.0.0.1", plane.mqtt_tls_port if tls else plane.mqtt_port)
    client.loop_start()
    client.subscribe(f"{prefix}/{device}/ack", qos=1)
    times = []
    try:
        if not subscribed.wait(10):
            raise TimeoutError(f"the broker did not confirm the subscription to {prefix}/{device}/ack")
        for i in range(calls):
            command_id = f"raw-{i}-{uuid.uuid4().hex[:6]}"
            started = time.perf_counter()
            client.publish(f"{prefix}/{device}/cmd", json.dumps({"id": command_id, "cmd": "get_state", "params": {}}),
                           qos=1)
            with arrived:
                if not arrived.wait_for(lambda command_id=command_id: command_id in acked, timeout=5):
                    raise TimeoutError(f"no ack for {command_id}")
            times.append((acked[command_id] - started) * 1000)
    finally:
        client.loop_stop()
        client.disconnect()
    return times


def floor_figures(p50_ms: float, p99_ms: float, kube: list[float], mqtt: list[float]) -> dict[str, float]:
    """Both floors' p50/p99 and Corral's p50 and p99 as multiples of each. The goals (p50 <= 6, p99 <= 15
    Kubernetes floors) read "the floor" as its p50, as "16.5 floors at p50" did; p99 against the floor's own
    p99 is there too, since a busy machine stretches both tails."""
    figures = {"kube_floor_p50_ms": round(statistics.median(kube), 2),
               "kube_floor_p99_ms": round(percentile(kube, 0.99), 2),
               "mqtt_p50_ms": round(statistics.median(mqtt), 2), "mqtt_p99_ms": round(percentile(mqtt, 0.99), 2)}
    figures["x_kube_floor_p50"] = round(p50_ms / figures["kube_floor_p50_ms"], 1)
    figures["x_kube_floor_p99_of_p50"] = round(p99_ms / figures["kube_floor_p50_ms"], 1)
    figures["x_kube_floor_p99_of_p99"] = round(p99_ms / figures["kube_floor_p99_ms"], 1)
    figures["x_mqtt_p50"] = round(p50_ms / figures["mqtt_p50_ms"], 1)
    figures["x_mqtt_p99_of_p99"] = round(p99_ms / figures["mqtt_p99_ms"], 1)
    return figures


def print_floors(what: str, figures: dict[str, float]) -> None:
    print(f"Kubernetes floor (create -> watch): p50 {figures['kube_floor_p50_ms']} ms, "
          f"p99 {figures['kube_floor_p99_ms']} ms; {what} p50 is {figures['x_kube_floor_p50']}x its p50 (goal <= 6), "
          f"p99 {figures['x_kube_floor_p99_of_p50']}x its p50 (goal <= 15) and {figures['x_kube_floor_p99_of_p99']}x "
          f"its p99")
    print(f"MQTT floor (cmd -> ack): p50 {figures['mqtt_p50_ms']} ms, p99 {figures['mqtt_p99_ms']} ms; "
          f"{what} p50 is {figures['x_mqtt_p50']}x its p50, p99 {figures['x_mqtt_p99_of_p99']}x its p99")

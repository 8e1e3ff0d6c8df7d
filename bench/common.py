"""What the benchmarks share: a control plane to run on, percentiles, and where results go."""

from __future__ import annotations

import json
import platform
import sys
import tempfile
import time
import uuid
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
def bench_plane() -> Iterator[Plane]:
    """The plane of `corral dev up` in this checkout if it runs, else a fresh one removed afterwards."""
    plane = DevPlane(REPO / ".corral" / "dev", progress=say).running()
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

    from tests.gateway_harness import capabilities_readable, grant_agent
    from corral.client.install import install_api
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

"""A bounded soak: Intents at a steady rate through the controller and real firmware, for minutes.

Nothing may be lost (every Intent ends EXECUTED) or run twice (each lamp switched exactly as often as it
was asked), the controller's memory must stay flat (the slope of its RSS is reported), and the p99 time
from an Intent's creation to its final code is reported. The default run soaks for 20 s at 10 Intents/s;
`--slow` runs the full campaign: 10 minutes at 20 Intents/s over 200 devices.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from corral.api.codes import FINAL_PHASES
from corral.client.intents import submit
from corral.devcluster.plane import Plane
from tests.controller_harness import ControllerProcess, device
from tests.fleet_harness import hardware_applies, running_fleet
from tests.harness import grant, rss_mib, wait_for

pytestmark = pytest.mark.integration


def slope_per_minute(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB), in MiB per minute."""
    xs, ys = [s[0] for s in samples], [s[1] for s in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return 60 * sum((x - mx) * (y - my) for x, y in samples) / sum((x - mx) ** 2 for x in xs)


def soak(plane: Plane, admin: kubernetes.client.ApiClient, namespace: str, logs: Path,
         lamps: int, rate: float, seconds: float) -> dict[str, Any]:
    operator = grant(plane, admin, namespace, "operator", "[get, list, read, write]", "[get]", "write")
    requester = f"system:serviceaccount:{namespace}:operator"
    names = [f"lamp-{i:03d}" for i in range(lamps)]
    prefix = f"soak-{uuid.uuid4().hex[:6]}"
    created: dict[str, float] = {}
    finished: dict[str, tuple[float, str]] = {}
    stop = threading.Event()

    def follow() -> None:  # the final codes, as they are written, from a watch
        objects = kubernetes.client.CustomObjectsApi(admin)
        while not stop.is_set():
            for event in kubernetes.watch.Watch().stream(objects.list_namespaced_custom_object, "corral.dev",
                                                         "v1alpha1", namespace, "intents", timeout_seconds=5):
                status = event["object"].get("status") or {}
                name = event["object"]["metadata"]["name"]
                if status.get("phase") in FINAL_PHASES and name not in finished:
                    finished[name] = (time.monotonic(), status.get("code"))

    with running_fleet(plane, prefix, dict.fromkeys(names, "light"), telemetry_interval_s=10.0,
                       connect_spread_s=lamps / 100, enroll_in=(admin, namespace)) as fleet:
        controller = ControllerProcess(plane, namespace, prefix, logs / "controller.log", "--intent-ttl", "30")
        controller.start()
        watcher = threading.Thread(target=follow, daemon=True)
        try:
            wait_for(lambda: all((device(admin, namespace, n).get("status") or {}).get("inSync") for n in names),
                     "every lamp registered", timeout_s=120)
            watcher.start()
            memory: list[tuple[float, float]] = []
            started = time.monotonic()
            asked: dict[str, int] = dict.fromkeys(names, 0)
            i = 0
            while (now := time.monotonic()) - started < seconds:
                lamp = names[i % lamps]
                asked[lamp] += 1
                name = f"soak-{i:06d}"
                created[name] = time.monotonic()
                spec = {"device": lamp, "actuator": "power", "action": "set_state",
                        "params": {"value": asked[lamp] % 2 == 1}, "reason": "soak", "requester": requester}
                submit(operator, namespace, name, spec)
                if i % max(1, int(rate * 5)) == 0:
                    memory.append((now - started, rss_mib(controller.proc.pid)))
                i += 1
                time.sleep(max(0.0, started + i / rate - time.monotonic()))
            wait_for(lambda: len(finished) >= len(created), "every Intent final", timeout_s=120, interval_s=0.5)
        finally:
            stop.set()
            controller.stop()
        switched = {lamp: len([a for a in hardware_applies(fleet, lamp) if a[0] == "power"]) for lamp in names}
    latencies = sorted(finished[n][0] - created[n] for n in created)
    return {
        "intents": len(created), "executed": sum(1 for t, code in finished.values() if code == "EXECUTED"),
        "codes": sorted({code for _, code in finished.values()}),
        "duplicated_or_lost": {lamp: (asked[lamp], switched[lamp]) for lamp in names if asked[lamp] != switched[lamp]},
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 1),
        "rss_start_mib": round(memory[0][1], 1), "rss_end_mib": round(memory[-1][1], 1),
        "rss_slope_mib_per_min": round(slope_per_minute(memory), 2),
    }


def _check(result: dict[str, Any]) -> None:
    print(f"\nsoak: {result}")
    assert result["executed"] == result["intents"], f"every Intent EXECUTED: {result['codes']}"
    assert result["duplicated_or_lost"] == {}, "each lamp switched exactly as often as it was asked"


def test_a_short_soak_loses_nothing_and_runs_nothing_twice(
        plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path) -> None:
    _check(soak(plane, corral_api, namespace, tmp_path, lamps=40, rate=10, seconds=20))


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_ten_minutes_at_20_intents_a_second_over_200_devices(
        plane: Plane, corral_api: kubernetes.client.ApiClient, namespace: str, tmp_path: Path) -> None:
    result = soak(plane, corral_api, namespace, tmp_path, lamps=200, rate=20, seconds=600)
    _check(result)
    assert result["rss_slope_mib_per_min"] < 2.0, "memory stays flat"

"""Status write amplification: Device status writes per device per minute at steady telemetry (1 Hz).

Three cases, each with its own devices and controller, counted by the controller's
corral_status_writes_total over a window after registration has settled:
  still    - devices send the same readings every second: nothing changes (target: 0);
  natural  - simulated sht30 sensors (real firmware) with their usual wander, default deadbands;
  jumping  - every reading differs from the last by far more than the deadband (worst case; target <= 6).

    .venv/bin/python bench/status_writes.py [--devices 50] [--window 60]

Writes bench/results/status_writes-<time>.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path

from common import agent_namespace, bench_plane, say, wait_registered, write_result
from corral.devcluster.plane import Plane
from corral.devcluster.processes import free_port
from tests.controller_harness import ControllerProcess
from tests.fleet_harness import played_thermometers, running_fleet
from tests.harness import scrape


def writes(port: int) -> float:
    return sum(v for k, v in scrape(port).items() if k.startswith("corral_status_writes_total"))


def measure(plane: Plane, admin: object, namespace: str, prefix: str, count: int, window_s: float,
            logs: Path) -> float:
    metrics = free_port()
    controller = ControllerProcess(plane, namespace, prefix, logs / f"controller-{prefix}.log",
                                   "--metrics-port", str(metrics))
    controller.start()
    try:
        wait_registered(admin, namespace, count)
        time.sleep(12)  # first sensor writes and the registration's own writes settle
        before = writes(metrics)
        time.sleep(window_s)
        return (writes(metrics) - before) / count / (window_s / 60)
    finally:
        controller.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=50)
    parser.add_argument("--window", type=float, default=60)
    args = parser.parse_args()
    results = {}
    with bench_plane() as plane, tempfile.TemporaryDirectory() as logs:
        for case in ("still", "natural", "jumping"):
            with agent_namespace(plane) as (admin, namespace, _):
                prefix = f"sw-{case}-{uuid.uuid4().hex[:4]}"
                ids = [f"{case}-{i:03d}" for i in range(args.devices)]
                say(f"case {case}: {args.devices} devices at 1 Hz")
                if case == "natural":
                    devices = running_fleet(plane, prefix, dict.fromkeys(ids, "sht30"), telemetry_interval_s=1.0,
                                            connect_spread_s=2.0, enroll_in=(admin, namespace))
                else:
                    devices = played_thermometers(plane, prefix, ids, (lambda _d, _s: 21.5) if case == "still" else
                                                  (lambda _d, s: 10.0 if s % 2 else 60.0),
                                                  enroll_in=(admin, namespace))
                with devices:
                    results[case] = measure(plane, admin, namespace, prefix, len(ids), args.window, Path(logs))
            say(f"  {case}: {results[case]:.2f} status writes per device per minute")
    for case, rate in results.items():
        print(f"status writes per device per minute at 1 Hz telemetry, {case}: {rate:.2f}")
    write_result("status_writes", {"devices": args.devices, "window_s": args.window,
                                   "writes_per_device_per_minute": {k: round(v, 2) for k, v in results.items()}})


if __name__ == "__main__":
    main()

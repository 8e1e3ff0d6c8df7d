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
import json
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from common import agent_namespace, bench_plane, say, scrape, wait_registered, write_result

import paho.mqtt.client as mqtt

from corral.devcluster.plane import Plane
from corral.devcluster.processes import free_port
from tests.controller_harness import ControllerProcess
from tests.fleet_harness import announce, running_fleet

INFO = {"name": "Thermometer", "model": "bench-thermometer", "fw": "1.0.0",
        "sensors": [{"metric": "temperature", "unit": "°C", "range": {"min": -40, "max": 85}}]}


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


def scripted(plane: Plane, prefix: str, ids: list[str], value: Callable[[int], float]) -> threading.Event:
    """Announce sensor-only devices and play them from here: telemetry value(second) at 1 Hz for every
    device, and an ack with the (empty) state to every command, as firmware would."""
    for device_id in ids:
        announce(plane, prefix, device_id, {**INFO, "device_id": device_id})
    stop = threading.Event()

    def send() -> None:
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{prefix}-telemetry")

        def ack(_c: object, _u: object, message: mqtt.MQTTMessage) -> None:
            command = json.loads(message.payload)
            device_id = message.topic.split("/")[1]
            client.publish(f"{prefix}/{device_id}/ack",
                           json.dumps({"id": command.get("id"), "ok": True, "error": None, "state": {}}))

        client.on_message = ack
        client.connect("127.0.0.1", plane.mqtt_port)
        client.loop_start()
        client.subscribe(f"{prefix}/+/cmd")
        second = 0
        while not stop.is_set():
            now = int(time.time() * 1000)
            for device_id in ids:
                sample = {"metric": "temperature", "value": value(second), "ts": now}
                client.publish(f"{prefix}/{device_id}/telemetry", json.dumps({"ts": now, "samples": [sample]}))
            second += 1
            stop.wait(1.0)
        client.disconnect()
        client.loop_stop()

    threading.Thread(target=send, daemon=True).start()
    return stop


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
                    with running_fleet(plane, prefix, dict.fromkeys(ids, "sht30"), telemetry_interval_s=1.0,
                                       connect_spread_s=2.0):
                        results[case] = measure(plane, admin, namespace, prefix, len(ids), args.window, Path(logs))
                else:
                    stop = scripted(plane, prefix, ids, (lambda s: 21.5) if case == "still" else
                                    (lambda s: 10.0 if s % 2 else 60.0))
                    try:
                        results[case] = measure(plane, admin, namespace, prefix, len(ids), args.window, Path(logs))
                    finally:
                        stop.set()
            say(f"  {case}: {results[case]:.2f} status writes per device per minute")
    for case, rate in results.items():
        print(f"status writes per device per minute at 1 Hz telemetry, {case}: {rate:.2f}")
    write_result("status_writes", {"devices": args.devices, "window_s": args.window,
                                   "writes_per_device_per_minute": {k: round(v, 2) for k, v in results.items()}})


if __name__ == "__main__":
    main()

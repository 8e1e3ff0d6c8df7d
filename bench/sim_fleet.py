"""Benchmark: can `corral sim` hold its telemetry rate with 500 devices, and what does it cost?

Starts a private Mosquitto on a free loopback port, runs `corral sim` with N
devices (every catalog type in turn) as its own process, subscribes to their
telemetry, and after a warm-up measures for a window:

  - achieved vs configured telemetry rate (messages/s), and per-device counts
  - lag: receive time minus the message's own `ts`
  - CPU% and RSS of the simulator process (and Mosquitto's CPU%)
  - how long it took for every device to be online, and for all to go offline on SIGTERM

    .venv/bin/python bench/sim_fleet.py                       # 500 devices, 1 s interval, 60 s window
    .venv/bin/python bench/sim_fleet.py --devices 100 --duration 20
    .venv/bin/python bench/sim_fleet.py --broker open         # the cost of accounts and TLS: compare

`--broker tls` (the default) is the local plane's broker: every device logs in with its own account
(dynamic security plugin, one role per device) over TLS; `auth` the same without TLS; `open` anonymous
clients and no ACLs, as before devices were enrolled.

Prints a summary and writes JSON to bench/results/sim_fleet-<time>.json.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import platform
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from common import REPO, RESULTS
from corral.devcluster import broker as plane_broker
from corral.devcluster.processes import accepts_connections, free_port
from corral.devices.credentials import write_credentials
from corral_sim.catalog import device_types
from tests.broker_harness import OwnBroker, device_accounts, observer

PREFIX = "bench"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def rss_mib(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_SIZE / 2**20


class Listener:
    """Counts telemetry and status messages, per device, with receive-time lag."""

    def __init__(self, port: int, account: tuple[str, str] | None) -> None:
        self.lock = threading.Lock()
        self.counting = False
        self.telemetry: Counter[str] = Counter()
        self.lags_ms: list[float] = []
        self.online: set[str] = set()
        self.offline: set[str] = set()
        subscribed = threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=account[0] if account else "bench-listener",
                                  protocol=mqtt.MQTTv311)
        if account is not None:
            self.client.username_pw_set(*account)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.connect("127.0.0.1", port, keepalive=30)
        self.client.loop_start()
        self.client.subscribe([(f"{PREFIX}/+/telemetry", 0), (f"{PREFIX}/+/status", 1)])
        if not subscribed.wait(5):
            raise RuntimeError("the listener could not subscribe")

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        received_ms = time.time() * 1000
        _, device_id, kind = message.topic.split("/")
        with self.lock:
            if kind == "status":
                (self.online if message.payload == b"online" else self.offline).add(device_id)
                if message.payload == b"online":
                    self.offline.discard(device_id)
            elif self.counting:
                self.telemetry[device_id] += 1
                self.lags_ms.append(received_ms - json.loads(message.payload)["ts"])

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def device_ids(devices: int) -> list[str]:
    """The ids `corral sim` gives the devices of device_args(devices)."""
    types = device_types()
    counts = Counter(types[i % len(types)] for i in range(devices))
    return [f"{t.replace('_', '-')}-{n}" for t, count in sorted(counts.items()) for n in range(1, count + 1)]


def device_args(devices: int) -> list[str]:
    types = device_types()
    counts = Counter(types[i % len(types)] for i in range(devices))
    return [arg for t, n in sorted(counts.items()) for arg in ("--device", f"{t}:{n}")]


def wait_until(what: str, probe: Any, timeout_s: float) -> float:
    start = time.monotonic()
    while not probe():
        if time.monotonic() - start > timeout_s:
            raise RuntimeError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - start


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=500)
    parser.add_argument("--interval", type=float, default=1.0, help="telemetry interval per device, seconds")
    parser.add_argument("--duration", type=float, default=60.0, help="measurement window, seconds")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds after all devices are online")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--broker", choices=["tls", "auth", "open"], default="tls",
                        help="devices log in with their own accounts over TLS (default), without TLS, or anonymously")
    parser.add_argument("--stock-broker", action="store_true",
                        help="use the dev plane's mosquitto.conf as is (Nagle on: ~40 ms p99 lag at the listener)")
    args = parser.parse_args()

    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    workdir = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    port = free_port()
    ids = device_ids(args.devices)
    own = OwnBroker(port, workdir)
    if args.broker == "open":
        conf_file = workdir / "mosquitto.conf"
        conf_file.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                             f"max_queued_messages 100000\nuser {getpass.getuser()}\n"
                             + ("" if args.stock_broker else "set_tcp_nodelay true\n"))
    else:
        # The local plane's broker (mosquitto_conf: TCP_NODELAY on, so small messages are not held back ~40 ms).
        conf_file = plane_broker.prepare(workdir, port, own.tls_port, own.broker_passwords).conf
        if args.stock_broker:
            conf_file.write_text(conf_file.read_text().replace("set_tcp_nodelay true\n", ""))
    broker_log = open(workdir / "mosquitto.log", "wb")  # noqa: SIM115 - the broker writes it until the end
    broker = subprocess.Popen([mosquitto, "-c", str(conf_file)], stdout=broker_log, stderr=subprocess.STDOUT)
    sim: subprocess.Popen[bytes] | None = None
    listener: Listener | None = None
    try:
        wait_until("Mosquitto to listen", lambda: accepts_connections(port), 10)
        login: list[str] = []
        listener_account = None
        if args.broker != "open":
            passwords = {d: secrets.token_urlsafe(16) for d in ids}
            accounts_started = time.monotonic()
            device_accounts(own, PREFIX, passwords)
            print(f"{len(ids)} device accounts made in {time.monotonic() - accounts_started:.1f} s", file=sys.stderr)
            write_credentials(str(workdir / "credentials.json"), passwords)
            listener_account = observer(own, "listener")
            login = ["--credentials", str(workdir / "credentials.json")]
            if args.broker == "tls":
                login += ["--mqtt-ca", str(workdir / "tls" / "ca.crt")]
        url = f"mqtts://127.0.0.1:{own.tls_port}" if args.broker == "tls" else f"mqtt://127.0.0.1:{port}"
        listener = Listener(port, listener_account)
        command = [
            sys.executable, "-m", "corral.cli.main", "sim", *device_args(args.devices), "--mqtt", url, *login,
            "--prefix", PREFIX, "--telemetry-interval", str(args.interval), "--seed", str(args.seed),
        ]
        sim_log = open(workdir / "sim.log", "wb")  # noqa: SIM115 - the simulator writes it until the end
        started = time.monotonic()
        sim = subprocess.Popen(command, stdout=sim_log, stderr=subprocess.STDOUT, cwd=REPO)
        all_online_s = wait_until(f"{args.devices} devices online", lambda: len(listener.online) >= args.devices, 120)
        print(f"{args.devices} devices online after {all_online_s:.1f} s; warming up {args.warmup:g} s", file=sys.stderr)
        time.sleep(args.warmup)

        rss: list[float] = []
        sim_cpu0, broker_cpu0, t0 = cpu_seconds(sim.pid), cpu_seconds(broker.pid), time.monotonic()
        with listener.lock:
            listener.counting = True
        while time.monotonic() - t0 < args.duration:
            rss.append(rss_mib(sim.pid))
            time.sleep(1.0)
        with listener.lock:
            listener.counting = False
            counts = dict(listener.telemetry)
            lags = list(listener.lags_ms)
        window = time.monotonic() - t0
        sim_cpu = (cpu_seconds(sim.pid) - sim_cpu0) / window * 100
        broker_cpu = (cpu_seconds(broker.pid) - broker_cpu0) / window * 100
        rss.append(rss_mib(sim.pid))

        stop_start = time.monotonic()
        sim.send_signal(signal.SIGTERM)
        sim.wait(30)
        wait_until("every device offline", lambda: len(listener.offline) >= args.devices, 30)
        stop_s = time.monotonic() - stop_start
        run_s = time.monotonic() - started

        configured = args.devices / args.interval
        achieved = sum(counts.values()) / window
        per_device = [counts.get(d, 0) for d in sorted(listener.online | listener.offline)]
        result = {
            "benchmark": "sim_fleet",
            "command": " ".join(["bench/sim_fleet.py", *sys.argv[1:]]),
            "sim_command": " ".join(["corral", *command[3:]]),
            "devices": args.devices,
            "broker_tcp_nodelay": not args.stock_broker,
            "broker": args.broker,
            "telemetry_interval_s": args.interval,
            "window_s": round(window, 2),
            "configured_rate_msgs_per_s": round(configured, 1),
            "achieved_rate_msgs_per_s": round(achieved, 1),
            "achieved_ratio": round(achieved / configured, 4),
            "per_device_messages": {"min": min(per_device), "max": max(per_device),
                                    "expected": round(window / args.interval, 1)},
            "lag_ms": {"p50": round(percentile(lags, 0.5), 1), "p99": round(percentile(lags, 0.99), 1),
                       "max": round(max(lags), 1) if lags else None},
            "sim_cpu_percent": round(sim_cpu, 1),
            "sim_rss_mib": {"max": round(max(rss), 1), "mean": round(statistics.mean(rss), 1)},
            "mosquitto_cpu_percent": round(broker_cpu, 1),
            "all_online_after_s": round(all_online_s, 2),
            "all_offline_after_sigterm_s": round(stop_s, 2),
            "sim_exit_code": sim.returncode,
            "run_s": round(run_s, 1),
            "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(),
                     "processor": _cpu_model()},
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = RESULTS / f"sim_fleet-{time.strftime('%Y%m%d-%H%M%S')}.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(
            f"{args.devices} devices ({args.broker} broker), telemetry every {args.interval:g} s, {window:.0f} s window:\n"
            f"  rate      configured {configured:.1f} msg/s, achieved {achieved:.1f} msg/s ({achieved / configured:.1%});"
            f" per device {min(per_device)}-{max(per_device)} messages (expected {window / args.interval:.0f})\n"
            f"  lag       p50 {result['lag_ms']['p50']} ms, p99 {result['lag_ms']['p99']} ms\n"
            f"  simulator CPU {sim_cpu:.1f}% of one core, RSS max {max(rss):.1f} MiB\n"
            f"  mosquitto CPU {broker_cpu:.1f}%\n"
            f"  all online after {all_online_s:.1f} s; all offline {stop_s:.1f} s after SIGTERM (exit {sim.returncode})\n"
            f"  written: {out.relative_to(REPO)}"
        )
        return 0 if sim.returncode == 0 else 1
    finally:
        if listener is not None:
            listener.close()
        if sim is not None and sim.poll() is None:
            sim.kill()
            sim.wait()
        broker.terminate()
        broker.wait(10)
        broker_log.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())

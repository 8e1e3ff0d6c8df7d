"""What Mosquitto's debug log costs: messages/s through the local plane's broker with and without `log_type debug`.

The controller learns of the PUBLISHes the broker's ACLs refuse only from that log (Mosquitto 2.0 names them
at debug level alone; the dynamic security plugin logs nothing), so the local plane runs it on. This measures
what that costs: one publisher sends N QoS 0 (or 1) messages of a telemetry's size as fast as it can, one
subscriber receives them, on two brokers configured as the plane's but for the debug log; each broker
runs alone, in turn, `--rounds` times. Also: the log's bytes per message, and its refusal lines per second
when a client publishes only on topics it may not.

    .venv/bin/python bench/broker_debug_log.py                 # 20,000 messages, QoS 0, 3 rounds
    .venv/bin/python bench/broker_debug_log.py --qos 1 --messages 10000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from common import say, write_result
from corral.devcluster import broker as plane_broker
from corral.devcluster import files
from corral.devcluster.processes import accepts_connections, free_port

PAYLOAD = json.dumps({"ts": 1767225600000, "samples": [{"metric": "temperature", "value": 21.5,
                                                         "ts": 1767225600000}]}).encode()


def start_broker(workdir: Path, debug: bool) -> tuple[subprocess.Popen[bytes], int, dict[str, str], Path]:
    port, tls_port = free_port(), free_port()
    passwords = plane_broker.new_passwords()
    prepared = plane_broker.prepare(workdir, port, tls_port, passwords)
    tls = plane_broker.certificates(workdir)
    conf = files.mosquitto_conf(port, plane_broker.plugin_path(), workdir / "dynamic-security.json",
                                files.BrokerTls(tls_port, tls.ca_file, tls.cert_file, tls.key_file),
                                plane_broker.debug_log(workdir) if debug else None)
    prepared.conf.write_text(conf)
    log_path = plane_broker.debug_log(workdir) if debug else workdir / "mosquitto.out"
    with open(workdir / "mosquitto.out", "wb") as log:
        proc = subprocess.Popen([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(prepared.conf)],
                                stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while not accepts_connections(port):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"mosquitto did not start: {log_path.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, port, passwords, log_path


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (/proc/PID/stat, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client(port: int, username: str, password: str) -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=username, protocol=mqtt.MQTTv311)
    c.username_pw_set(username, password)
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    return c


def one_round(port: int, passwords: dict[str, str], messages: int, qos: int) -> float:
    """Messages a second from the first publish to the last one received."""
    received = 0
    done, subscribed = threading.Event(), threading.Event()

    def on_message(_c: Any, _u: Any, _m: mqtt.MQTTMessage) -> None:
        nonlocal received
        received += 1
        if received >= messages:
            done.set()

    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=files.BROKER_CONTROLLER, protocol=mqtt.MQTTv311)
    sub.username_pw_set(files.BROKER_CONTROLLER, passwords["controller"])
    sub.on_message = on_message
    sub.on_subscribe = lambda *_: subscribed.set()
    sub.connect("127.0.0.1", port, keepalive=30)
    sub.loop_start()
    sub.subscribe("+/+/telemetry", qos=qos)  # what the controller account may subscribe to
    assert subscribed.wait(10), "the subscriber could not subscribe"
    pub = client(port, files.BROKER_ADMIN, passwords["admin"])
    try:
        start = time.perf_counter()
        for i in range(messages):
            info = pub.publish(f"bench/dev-{i % 50}/telemetry", PAYLOAD, qos=qos)
            if qos and i % 500 == 499:
                info.wait_for_publish(30)  # keep paho's window of in-flight messages bounded
        assert done.wait(120), f"only {received} of {messages} arrived"
        return messages / (time.perf_counter() - start)
    finally:
        for c in (pub, sub):
            c.disconnect()
            c.loop_stop()


def refusal_lines(port: int, passwords: dict[str, str], log_path: Path, attempts: int) -> int:
    """A client with no publish rights at all publishes `attempts` times; the log's Denied PUBLISH lines."""
    from tests.broker_harness import OwnBroker, dynsec

    own = OwnBroker(port, log_path.parent, passwords)
    dynsec(own, [{"command": "createClient", "username": "bench-nobody", "password": "bench-nobody-pw"}])
    c = client(port, "bench-nobody", "bench-nobody-pw")
    try:
        for i in range(attempts):
            c.publish(f"bench/other-{i % 5}/event", b"{}", qos=1).wait_for_publish(5)
    finally:
        c.disconnect()
        c.loop_stop()
    time.sleep(0.5)  # a benchmark: let the broker write its last lines
    return log_path.read_text(errors="replace").count("Denied PUBLISH from bench-nobody")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--qos", type=int, choices=[0, 1], default=0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"plain": [], "debug": []}
    cpu_us: dict[str, list[float]] = {"plain": [], "debug": []}
    log_bytes: dict[str, float] = {}
    refused = 0
    for debug in (False, True, False, True):  # alternating, so a slow moment of the machine hits both
        name = "debug" if debug else "plain"
        with tempfile.TemporaryDirectory(prefix=f"corral-bench-{name}-") as tmp:
            proc, port, passwords, log_path = start_broker(Path(tmp), debug)
            try:
                cpu0 = cpu_seconds(proc.pid)
                got = [one_round(port, passwords, args.messages, args.qos) for _ in range(args.rounds)]
                cpu_us[name].append((cpu_seconds(proc.pid) - cpu0) / (args.messages * args.rounds) * 1e6)
                log_bytes[name] = log_path.stat().st_size / (args.messages * args.rounds)
                if debug:
                    refused = refusal_lines(port, passwords, log_path, 20)
            finally:
                proc.terminate()
                proc.wait(10)
        rates[name] += got
        say(f"{name}: {statistics.median(got):,.0f} messages/s (rounds {', '.join(f'{r:,.0f}' for r in got)}), "
            f"broker CPU {cpu_us[name][-1]:.1f} µs/message, log {log_bytes[name]:.0f} bytes/message")
    plain, debug_rate = statistics.median(rates["plain"]), statistics.median(rates["debug"])
    say(f"debug log: {debug_rate / plain * 100:.0f}% of the plain broker's rate (medians {plain:,.0f} and "
        f"{debug_rate:,.0f} messages/s); broker CPU {statistics.median(cpu_us['plain']):.1f} -> "
        f"{statistics.median(cpu_us['debug']):.1f} µs/message; {refused} of 20 refused publishes named in it")
    write_result("broker_debug_log", {"messages": args.messages, "qos": args.qos, "rounds": args.rounds,
                                      "plain_messages_per_s": round(plain), "debug_messages_per_s": round(debug_rate),
                                      "debug_relative": round(debug_rate / plain, 3),
                                      "broker_cpu_us_per_message_plain": round(statistics.median(cpu_us["plain"]), 2),
                                      "broker_cpu_us_per_message_debug": round(statistics.median(cpu_us["debug"]), 2),
                                      "debug_log_bytes_per_message": round(log_bytes["debug"]),
                                      "refusals_named": refused})


if __name__ == "__main__":
    main()

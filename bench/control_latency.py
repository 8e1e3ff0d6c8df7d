"""Control latency: MCP iot.control on a low-risk actuator until EXECUTED, next to two floors measured in
the same run on the same plane:

- the Kubernetes floor: create a plain object (a ConfigMap) and see it in a watch;
- the MQTT floor: a command to the same device and its ack.

Real parts: the local kube-apiserver, Mosquitto, one simulated light (real firmware), the controller
(`corral run`) and the gateway (`corral mcp --transport http`), driven by the official MCP client
(protocol 2026-07-28). Each call alternates the light's power with a new request_id; the MQTT floor is a
`get_state` command published straight to the device, which acks with its state and changes nothing.
Also counted: the API requests each call costs, from the API server's own counters.

    .venv/bin/python bench/control_latency.py [--calls 200] [--fresh-plane] [--tls]

Every client logs in with its own account (the device with its enrollment, the raw MQTT client with an
account of its own); `--tls` puts the device, the controller and the raw client on the TLS listener.

Prints p50/p99 of each and the ratios; writes bench/results/control_latency-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import ssl
import statistics
import threading
import time
import uuid
from typing import Any

import paho.mqtt.client as mqtt

from common import (
    agent_namespace,
    api_requests,
    bench_plane,
    kubernetes_floor,
    percentile,
    requests_per,
    running_corral,
    say,
    write_result,
)
from tests.broker_harness import observer
from tests.gateway_harness import MODERN, http_client


async def control_calls(url: str, token: str, calls: int) -> tuple[list[float], list[str]]:
    times, codes = [], []
    async with http_client(url, token, mode=MODERN) as client:
        await client.list_tools()
        for i in range(calls):
            args = {"device_id": "bench-light", "actuator": "power", "action": "set_state",
                    "params": {"value": i % 2 == 0}, "reason": "latency benchmark", "request_id": f"lat-{uuid.uuid4().hex[:12]}"}
            started = time.perf_counter()
            result = await client.call_tool("iot.control", args)
            times.append((time.perf_counter() - started) * 1000)
            codes.append((result.structured_content or {}).get("code", "error"))
    return times, codes


def mqtt_round_trips(plane: Any, prefix: str, calls: int, tls: bool) -> list[float]:
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
    # As the firmware and the controller do: small packets go out now, not after a delayed ACK.
    client.on_socket_open = lambda _c, _u, sock: sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client.connect("127.0.0.1", plane.mqtt_tls_port if tls else plane.mqtt_port)
    client.loop_start()
    client.subscribe(f"{prefix}/bench-light/ack", qos=1)
    time.sleep(0.5)
    times = []
    try:
        for i in range(calls):
            command_id = f"raw-{i}-{uuid.uuid4().hex[:6]}"
            started = time.perf_counter()
            client.publish(f"{prefix}/bench-light/cmd", json.dumps({"id": command_id, "cmd": "get_state", "params": {}}),
                           qos=1)
            with arrived:
                if not arrived.wait_for(lambda command_id=command_id: command_id in acked, timeout=5):
                    raise TimeoutError(f"no ack for {command_id}")
            times.append((acked[command_id] - started) * 1000)
    finally:
        client.loop_stop()
        client.disconnect()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--fresh-plane", action="store_true", help="a plane of its own, not `corral dev up`'s")
    parser.add_argument("--tls", action="store_true", help="devices, controller and the raw client over mqtts://")
    args = parser.parse_args()
    with bench_plane(args.fresh_plane) as plane, agent_namespace(plane) as (admin, namespace, token), \
            running_corral(plane, admin, namespace, {"bench-light": "light"}, tls=args.tls) as (url, prefix):
        say(f"  {args.calls} iot.control calls")
        before = api_requests(plane)
        control, codes = asyncio.run(control_calls(url, token, args.calls))
        per_call = requests_per(before, api_requests(plane), args.calls)
        say(f"  {args.calls} raw MQTT round trips")
        floor = mqtt_round_trips(plane, prefix, args.calls, args.tls)
        say(f"  {args.calls} Kubernetes create -> watch round trips")
        kube_floor = asyncio.run(kubernetes_floor(plane, namespace, args.calls))
    result = {
        "calls": args.calls, "tls": args.tls, "executed": codes.count("EXECUTED"),
        "control_p50_ms": round(statistics.median(control), 1), "control_p99_ms": round(percentile(control, 0.99), 1),
        "kube_floor_p50_ms": round(statistics.median(kube_floor), 2),
        "kube_floor_p99_ms": round(percentile(kube_floor, 0.99), 2),
        "mqtt_p50_ms": round(statistics.median(floor), 2), "mqtt_p99_ms": round(percentile(floor, 0.99), 2),
        "api_requests_per_call": round(sum(per_call.values()), 2), "api_requests": per_call,
    }
    result["x_kube_floor_p50"] = round(result["control_p50_ms"] / result["kube_floor_p50_ms"], 1)
    result["x_mqtt_p50"] = round(result["control_p50_ms"] / result["mqtt_p50_ms"], 1)
    print(f"iot.control -> EXECUTED ({result['executed']}/{args.calls}): p50 {result['control_p50_ms']} ms, "
          f"p99 {result['control_p99_ms']} ms")
    print(f"Kubernetes floor (create -> watch): p50 {result['kube_floor_p50_ms']} ms, p99 {result['kube_floor_p99_ms']} ms; "
          f"iot.control p50 is {result['x_kube_floor_p50']}x it")
    print(f"MQTT floor (cmd -> ack): p50 {result['mqtt_p50_ms']} ms, p99 {result['mqtt_p99_ms']} ms; "
          f"iot.control p50 is {result['x_mqtt_p50']}x it")
    print(f"API requests per call: {result['api_requests_per_call']} {per_call}")
    write_result("control_latency", result)


if __name__ == "__main__":
    main()

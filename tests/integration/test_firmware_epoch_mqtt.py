"""Fence 3 on a real Mosquitto: two controller replicas, each with its own broker account, command one simulated
device; the one with the older epoch is turned away by the device itself, and the fleet counts it (issue 31).

A broker of the test's own (tests/broker_harness.own_broker: the local plane's accounts and ACLs), no API server.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, cast

import paho.mqtt.client as mqtt
import pytest

from corral.devcluster import files
from tests.broker_harness import own_broker
from tests.fleet_harness import Watcher, cmd, hardware_applies, on_fleet, running_fleet
from tests.harness import wait_for

pytestmark = pytest.mark.integration

OLD, NEW = 1764500000000, 1764500012345


def replica(port: int, username: str, password: str) -> mqtt.Client:
    up: list[bool] = []
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=username, protocol=mqtt.MQTTv311)
    client.username_pw_set(username, password)
    client.on_connect = lambda _c, _u, _f, reason, _p: up.append(not reason.is_failure)
    client.connect("127.0.0.1", port, keepalive=10)
    client.loop_start()
    wait_for(lambda: up == [True], f"{username} to connect ({up})", timeout_s=10)
    return client


def command(client: mqtt.Client, prefix: str, command_id: str, value: bool, epoch: int) -> None:
    body = {**cmd(command_id, "set_state", "relay", value), "epoch": epoch}
    client.publish(f"{prefix}/relay-1/cmd", json.dumps(body).encode(), qos=1).wait_for_publish(5)


def test_the_device_turns_away_the_replica_with_the_older_epoch_and_the_fleet_counts_it(tmp_path: Path) -> None:
    prefix = f"ep-{uuid.uuid4().hex[:8]}"
    with own_broker(tmp_path) as running:
        broker = cast(Any, running)  # the harness types name the plane; an own broker answers the same
        watcher = Watcher(broker, prefix)
        password = running.broker_passwords["controller"]
        new_owner = replica(running.mqtt_port, files.LOCAL_CONTROLLER_REPLICAS[0], password)
        old_owner = replica(running.mqtt_port, files.LOCAL_CONTROLLER_REPLICAS[1], password)
        try:
            with running_fleet(broker, prefix, {"relay-1": "relay"}) as fleet:
                watcher.wait_status("relay-1", "online")
                command(new_owner, prefix, "c-new", True, NEW)
                assert watcher.wait_count("relay-1", "ack", 1)[0].json()["ok"]
                command(old_owner, prefix, "c-old", False, OLD)
                refused = watcher.wait_count("relay-1", "ack", 2)[1].json()
                assert not refused["ok"] and refused["id"] == "c-old"
                assert refused["stale_epoch"] == {"sent": OLD, "seen": NEW}
                assert refused["error"].startswith(f"stale epoch {OLD}: this device has seen epoch {NEW}")
                assert hardware_applies(fleet, "relay-1") == [("relay", True)], "the hardware moved for the new owner only"
                assert on_fleet(fleet, fleet.summary)["stale_epochs"] == 1

                # The epoch lives in RAM: after a power cycle the device takes the first epoch it hears again,
                # while the fleet's count of refusals outlives the instance that made them.
                on_fleet(fleet, lambda: fleet.power_cycle("relay-1", off_s=0.2))
                watcher.wait_status("relay-1", "online", after=1)
                command(old_owner, prefix, "c-old-2", False, OLD)
                assert watcher.wait_count("relay-1", "ack", 3)[2].json()["ok"]
                assert on_fleet(fleet, fleet.summary)["stale_epochs"] == 1
                assert on_fleet(fleet, lambda: fleet.devices["relay-1"].stale_epochs) == 1
        finally:
            for client in (new_owner, old_owner):
                client.disconnect()
                client.loop_stop()
            watcher.close()

"""The firmware against the real Mosquitto: what a controller (or a person with an MQTT client) sees.

Each test runs simulated devices (the real firmware, each with its own MQTT
connection) under a topic prefix of its own, and watches them from a separate
MQTT client, as the controller would. Executions are counted on the device
itself, so "exactly once" is checked where it happens.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest

from corral.contract.model import Contract
from corral.devcluster.plane import Plane
from corral_sim.catalog import contract_for
from corral_sim.fleet import Faults
from tests.fleet_harness import Watcher, cmd, firmware, on_fleet, retained, running_fleet

pytestmark = pytest.mark.integration



@pytest.fixture
def prefix() -> str:
    return f"fw-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def watcher(plane: Plane, prefix: str) -> Iterator[Watcher]:
    w = Watcher(plane, prefix)
    yield w
    w.close()


# Connect: info, status ----------------------------------------------------------------


def test_info_is_retained_and_matches_the_contract(plane: Plane, prefix: str, watcher: Watcher) -> None:
    with running_fleet(plane, prefix, {"hall-ac": "thermostat", "hall-light": "light"}):
        watcher.wait_status("hall-ac", "online")
        watcher.wait_status("hall-light", "online")
        for device_id, device_type in (("hall-ac", "thermostat"), ("hall-light", "light")):
            info = retained(plane, f"{prefix}/{device_id}/info")
            assert info.retain
            assert info.json() == {**contract_for(device_type), "device_id": device_id}
            contract = Contract.model_validate_json(info.payload)
            assert contract.device_id == device_id
            status = retained(plane, f"{prefix}/{device_id}/status")
            assert status.retain and status.payload == b"online"


# Commands and acks ----------------------------------------------------------------------


def test_a_command_executes_exactly_once_and_the_ack_carries_the_full_state(
    plane: Plane, prefix: str, watcher: Watcher
) -> None:
    with running_fleet(plane, prefix, {"ac": "thermostat"}) as fleet:
        watcher.wait_status("ac", "online")
        watcher.send("ac", cmd("c-1", "set_mode", "mode", "cool"))
        ack = watcher.wait_count("ac", "ack", 1)[0].json()
        assert ack == {
            "id": "c-1", "ok": True, "error": None,
            "state": {"mode": "cool", "target_temp": 16, "fan_speed": "auto", "firmware": "1.2.0"},
        }
        time.sleep(0.3)
        assert len(watcher.messages("ac", "ack")) == 1
        assert firmware(fleet, "ac").executions == 1
        assert on_fleet(fleet, lambda: list(fleet.devices["ac"].board.applied)) == [("mode", "cool", 1)]


def test_the_same_command_id_sent_three_times_executes_once(plane: Plane, prefix: str, watcher: Watcher) -> None:
    with running_fleet(plane, prefix, {"feeder": "pet_feeder"}) as fleet:
        watcher.wait_status("feeder", "online")
        for _ in range(3):
            watcher.send("feeder", cmd("feed-1", "feed", "portions", 2))
        acks = watcher.wait_count("feeder", "ack", 3)
        assert acks[0].payload == acks[1].payload == acks[2].payload
        assert acks[0].json()["state"]["portions"] == 2
        device = on_fleet(fleet, lambda: fleet.devices["feeder"])
        assert device.firmware.executions == 1 and device.firmware.duplicates == 2
        assert on_fleet(fleet, lambda: list(device.board.applied)) == [("portions", 2, 2)], "two portions, once"


def test_out_of_range_values_are_clamped_and_the_ack_says_so(plane: Plane, prefix: str, watcher: Watcher) -> None:
    with running_fleet(plane, prefix, {"ac": "thermostat", "lamp": "light"}):
        watcher.wait_status("ac", "online")
        watcher.wait_status("lamp", "online")
        watcher.send("ac", cmd("c-1", "set_value", "target_temp", 35))
        watcher.send("ac", cmd("c-2", "set_value", "target_temp", 22.3))
        watcher.send("lamp", cmd("c-3", "set_value", "brightness", 150))
        too_hot, off_step = (m.json() for m in watcher.wait_count("ac", "ack", 2))
        assert too_hot["ok"] and too_hot["state"]["target_temp"] == 30
        assert too_hot["clamped"] == {"actuator": "target_temp", "requested": 35, "applied": 30}
        assert off_step["state"]["target_temp"] == 22.5
        assert off_step["clamped"] == {"actuator": "target_temp", "requested": 22.3, "applied": 22.5}
        bright = watcher.wait_count("lamp", "ack", 1)[0].json()
        assert bright["state"]["brightness"] == 100 and bright["clamped"]["applied"] == 100


def test_unknown_commands_and_malformed_json_get_error_acks_and_the_device_keeps_running(
    plane: Plane, prefix: str, watcher: Watcher
) -> None:
    with running_fleet(plane, prefix, {"fan": "env_fan"}) as fleet:
        watcher.wait_status("fan", "online")
        watcher.send("fan", b"{this is not json")
        watcher.send("fan", cmd("c-2", "toggle", "fan"))
        watcher.send("fan", cmd("c-3", "set_level", "fan", "turbo"))
        watcher.send("fan", cmd("c-4", "set_level", "fan", "high"))
        acks = [m.json() for m in watcher.wait_count("fan", "ack", 4)]
        assert [(a["id"], a["ok"]) for a in acks] == [(None, False), ("c-2", False), ("c-3", False), ("c-4", True)]
        assert acks[0]["error"] == "malformed command: not JSON"
        assert acks[1]["error"] == "unknown command 'toggle'; commands: get_state, set_level, set_version"
        assert acks[2]["error"] == "value 'turbo' is not allowed for actuator 'fan'; allowed: off, low, mid, high"
        assert acks[3]["state"] == {"fan": "high", "firmware": "1.2.0"}
        assert [m.payload for m in watcher.messages("fan", "status")] == [b"online"], "never went offline"
        assert firmware(fleet, "fan").executions == 1


# Link loss, reconnect, clean stop, power -------------------------------------------------


def test_a_killed_link_publishes_offline_via_the_will_and_reconnect_republishes_info_and_online(
    plane: Plane, prefix: str, watcher: Watcher
) -> None:
    with running_fleet(plane, prefix, {"fan": "env_fan"}) as fleet:
        watcher.wait_status("fan", "online")
        watcher.send("fan", cmd("c-1", "set_level", "fan", "mid"))
        watcher.wait_count("fan", "ack", 1)
        before = len(watcher.messages("fan"))

        on_fleet(fleet, lambda: fleet.drop_link("fan", down_s=1.0))
        offline = watcher.wait_status("fan", "offline", after=1)
        online = watcher.wait_status("fan", "online", after=2)
        assert online.at - offline.at >= 0.8, "the link stayed down for a second"
        after = [m for m in watcher.messages("fan")[before:] if m.kind in ("status", "info")]
        assert [(m.kind, m.payload) for m in after if m.kind == "status"] == [("status", b"offline"), ("status", b"online")]
        assert [m.kind for m in after] == ["status", "info", "status"], "offline, then info and online again"
        assert json.loads(after[1].payload)["device_id"] == "fan"
        assert fleet.stats["clean_offline"] == 0, "the firmware did not say offline itself: the Will did"

        # Same firmware instance: state and dedup memory survived the link loss.
        watcher.send("fan", cmd("c-1", "set_level", "fan", "mid"))
        watcher.send("fan", cmd("c-2", "get_state"))
        acks = [m.json() for m in watcher.wait_count("fan", "ack", 3)]
        assert acks[1] == acks[0] and acks[2]["state"]["fan"] == "mid"
        device = firmware(fleet, "fan")
        assert device.executions == 1 and device.connects == 2


def test_a_clean_stop_leaves_a_retained_offline(plane: Plane, prefix: str, watcher: Watcher) -> None:
    with running_fleet(plane, prefix, {"plug": "relay", "valve": "water_valve"}) as fleet:
        watcher.wait_status("plug", "online")
        watcher.wait_status("valve", "online")
    assert fleet.stats["clean_offline"] == 2
    for device_id in ("plug", "valve"):
        watcher.wait_status(device_id, "offline")
        status = retained(plane, f"{prefix}/{device_id}/status")
        assert status.payload == b"offline"


def test_a_power_cycle_loses_state_and_dedup_memory_but_not_counter_totals(
    plane: Plane, prefix: str, watcher: Watcher
) -> None:
    with running_fleet(plane, prefix, {"feeder": "pet_feeder"}) as fleet:
        watcher.wait_status("feeder", "online")
        watcher.send("feeder", cmd("c-1", "feed", "portions", 3))
        assert watcher.wait_count("feeder", "ack", 1)[0].json()["state"]["portions"] == 3

        on_fleet(fleet, lambda: fleet.power_cycle("feeder", off_s=0.3))
        watcher.wait_status("feeder", "offline", after=1)
        watcher.wait_status("feeder", "online", after=2)
        assert len(watcher.messages("feeder", "info")) == 2

        watcher.send("feeder", cmd("c-1", "feed", "portions", 3))
        ack = watcher.wait_count("feeder", "ack", 2)[1].json()
        assert ack["ok"] and ack["state"]["portions"] == 3
        device = on_fleet(fleet, lambda: fleet.devices["feeder"])
        assert device.boots == 2
        assert device.firmware.executions == 1, "a new instance: the id was forgotten and ran again..."
        assert on_fleet(fleet, lambda: list(device.board.applied)) == [("portions", 3, 0)], "...feeding nothing"


def test_fault_switches_drop_links_and_delay_acks(plane: Plane, prefix: str, watcher: Watcher) -> None:
    faults = Faults(drop_link_every_s=0.4, link_down_s=0.2, ack_delay_ms=500)
    with running_fleet(plane, prefix, {"relay": "relay"}, faults=faults, seed=3) as fleet:
        watcher.wait_for(
            "two Will-offline and reconnect cycles",
            lambda: [m.payload for m in watcher.messages("relay", "status")].count(b"online") >= 3,
            timeout_s=15,
        )
        assert fleet.stats["link_drops"] >= 2
        statuses = [m.payload for m in watcher.messages("relay", "status")]
        assert statuses[:4] == [b"online", b"offline", b"online", b"offline"]

        def sent_and_acked() -> tuple[float, float] | None:
            watcher.wait_status("relay", "online", after=len(watcher.messages("relay", "status")) - 1)
            start = time.monotonic()
            watcher.send("relay", cmd(f"c-{uuid.uuid4().hex[:6]}", "set_state", "relay", True))
            try:
                acked = watcher.wait_for("an ack", lambda: [m for m in watcher.messages("relay", "ack") if m.at > start],
                                         timeout_s=1.5)
            except AssertionError:
                return None  # the link dropped in between; a lost command gets no ack, as on a real link
            return start, acked[0].at

        timing = next(t for t in (sent_and_acked() for _ in range(10)) if t)
        assert timing[1] - timing[0] >= 0.45, "the ack was held back by the ack-delay fault"


# Telemetry and events -------------------------------------------------------------------


def test_telemetry_is_periodic_and_timestamped(plane: Plane, prefix: str, watcher: Watcher) -> None:
    with running_fleet(plane, prefix, {"env": "env_fan", "scale": "scale"}, telemetry_interval_s=0.2):
        watcher.wait_status("env", "online")
        first = watcher.wait_count("env", "telemetry", 1)[0].at
        time.sleep(2.0)
        env = [m for m in watcher.messages("env", "telemetry") if first <= m.at <= first + 2.0]
        assert 8 <= len(env) <= 12, f"about 10 messages in 2 s at 5 Hz, got {len(env)}"
        bodies = [m.json() for m in env]
        assert all(b["ts"] > 1_600_000_000_000 for b in bodies), "epoch milliseconds"
        assert [b["ts"] for b in bodies] == sorted(b["ts"] for b in bodies)
        assert {s["metric"] for s in bodies[-1]["samples"]} == {"temperature", "humidity", "rssi"}
        scale = [m.json() for m in watcher.messages("scale", "telemetry")]
        weights = [s for s in scale[-1]["samples"] if s["metric"] == "weight"]
        assert len(weights) == 5, "the scale sends its ring buffer: five samples per report"
        assert len({s["ts"] for s in weights}) == 5 and all(s["ts"] <= scale[-1]["ts"] for s in weights)


def test_a_bouncing_door_contact_yields_one_event_per_change(plane: Plane, prefix: str, watcher: Watcher) -> None:
    with running_fleet(plane, prefix, {"front-door": "door_contact"}) as fleet:
        watcher.wait_status("front-door", "online")
        # The first event after connecting is the built-in `state` report.
        watcher.wait_count("front-door", "event", 1)
        on_fleet(fleet, lambda: fleet.change_input("front-door", "door", "open", bounce_ms=20))
        watcher.wait_count("front-door", "event", 2)
        on_fleet(fleet, lambda: fleet.change_input("front-door", "door", "closed", bounce_ms=20))
        watcher.wait_count("front-door", "event", 3)
        time.sleep(0.3)
        events = [m.json() for m in watcher.messages("front-door", "event")]
        assert [(e["event"], e["value"], e["seq"]) for e in events] == [
            ("state", "connect", 1), ("door", "open", 2), ("door", "closed", 3)
        ]

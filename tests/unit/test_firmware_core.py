"""The firmware core's behaviour, with no I/O: commands and acks, clamping, dedup, debouncing, telemetry.

These tests run twice: under CPython (pytest collects them as usual) and on the
real MicroPython interpreter (tests/unit/test_firmware_micropython.py loads
this very file into the MicroPython WebAssembly port and calls every test_
function). So this file itself must be MicroPython code: plain functions and
asserts, no pytest imports or fixtures, no `from __future__`, only corral_fw
imports.
"""

import json

from corral_fw.actuators import round_to_step
from corral_fw.clock import ManualClock
from corral_fw.contracts import TYPES
from corral_fw.debounce import Debouncer
from corral_fw.device import Device
from corral_fw.profiles import firmware_options
from corral_fw.ringbuf import RingBuffer
from corral_fw.rng import Rng, fnv1a
from corral_fw.simboard import SimBoard
from corral_fw.store import MemoryStore


class FakeTransport:
    """Records what the device publishes; `up = False` makes publishing fail as on a dropped link."""

    def __init__(self):
        self.published = []
        self.subscribed = []
        self.up = True

    def publish(self, topic, payload, retain, qos):
        if not self.up:
            return False
        self.published.append((topic, payload, retain, qos))
        return True

    def subscribe(self, topic, qos):
        self.subscribed.append((topic, qos))

    def on(self, suffix):
        return [p for p in self.published if p[0].endswith("/" + suffix)]


def load_contract(device_type):
    return __import__("corral_fw.contracts." + device_type, None, None, ["CONTRACT"]).CONTRACT


def make_device(device_type="thermostat", device_id="dev-1", seed=7, clock=None, store=None, **options):
    clock = clock or ManualClock()
    contract = load_contract(device_type)
    board = SimBoard(contract, device_id, seed, device_type, clock.ms(), auto_inputs=False)
    kwargs = firmware_options(device_type)
    kwargs.update(options)
    device = Device(contract, device_id, board, clock, prefix="t", store=store, **kwargs)
    device.transport = FakeTransport()
    return device, board, clock


def command(device, command_id, cmd, actuator=None, value=None, **extra):
    params = {}
    if actuator is not None:
        params["actuator"] = actuator
    if value is not None:
        params["value"] = value
    params.update(extra)
    return json.loads(device.handle_command(json.dumps({"id": command_id, "cmd": cmd, "params": params})))


# Connection: info, status, will ---------------------------------------------------------


def test_info_is_the_frozen_contract_plus_the_device_id():
    device, _, _ = make_device("env_fan", "kitchen-env")
    info = json.loads(device.info_payload)
    expected = dict(load_contract("env_fan"))
    expected["device_id"] = "kitchen-env"
    assert info == expected


def test_connect_subscribes_first_then_publishes_retained_info_online_and_its_state():
    device, _, _ = make_device("env_fan", "kitchen-env")
    device.on_connect()
    transport = device.transport
    assert transport.subscribed == [("t/kitchen-env/cmd", 1)]
    assert [(p[0], p[2], p[3]) for p in transport.published] == [
        ("t/kitchen-env/info", True, 1),
        ("t/kitchen-env/status", True, 1),
        ("t/kitchen-env/event", False, 1),
    ]
    assert transport.published[1][1] == "online"
    state = json.loads(transport.published[2][1])
    assert (state["event"], state["value"], state["state"]) == ("state", "connect", device.state())
    device.on_connect()
    assert len(transport.on("info")) == 2, "every connect republishes info"


def test_will_and_clean_shutdown_both_leave_retained_offline():
    device, _, _ = make_device("relay", "plug-1")
    assert device.will() == ("t/plug-1/status", "offline")
    device.shutdown()
    assert device.transport.published == [("t/plug-1/status", "offline", True, 1)]


# Commands and acks ----------------------------------------------------------------------


def test_a_command_executes_once_and_the_ack_carries_the_full_state():
    device, board, _ = make_device("thermostat")
    ack = command(device, "c-1", "set_mode", "mode", "cool")
    assert ack == {
        "id": "c-1",
        "ok": True,
        "error": None,
        "state": {"mode": "cool", "target_temp": 16, "fan_speed": "auto", "firmware": "1.2.0"},
    }
    assert board.applied == [("mode", "cool", 1)]
    assert device.executions == 1


def test_a_command_arriving_on_the_cmd_topic_is_answered_on_the_ack_topic():
    device, _, _ = make_device("env_fan", "fan-1")
    device.on_message("t/fan-1/cmd", b'{"id": "c-9", "cmd": "set_level", "params": {"actuator": "fan", "value": "mid"}}')
    device.on_message("t/fan-1/telemetry", b"ignored: not our command topic")
    acks = device.transport.on("ack")
    assert len(acks) == 1
    _topic, payload, retain, qos = acks[0]
    assert (retain, qos) == (False, 1)
    assert json.loads(payload)["state"]["fan"] == "mid"


def test_a_repeated_id_returns_the_stored_ack_verbatim_and_executes_nothing():
    device, board, _ = make_device("env_fan")
    payload = b'{"id": "c-1", "cmd": "set_level", "params": {"actuator": "fan", "value": "high"}}'
    acks = [device.handle_command(payload) for _ in range(3)]
    assert acks[0] == acks[1] == acks[2]
    assert board.applied == [("fan", "high", 1)]
    assert device.executions == 1 and device.duplicates == 2
    # Even if the state has moved on since, the repeat answers what happened then.
    command(device, "c-2", "set_level", "fan", "low")
    assert device.handle_command(payload) == acks[0]
    assert json.loads(acks[0])["state"]["fan"] == "high"


def test_a_repeated_id_with_a_different_body_still_gets_the_first_answer():
    device, board, _ = make_device("env_fan")
    first = command(device, "c-1", "set_level", "fan", "high")
    again = command(device, "c-1", "set_level", "fan", "off")
    assert again == first
    assert board.applied == [("fan", "high", 1)]


def test_dedup_memory_is_bounded_and_forgets_the_oldest_id_first():
    device, _board, _ = make_device("env_fan", dedup_size=64)
    for i in range(65):
        command(device, "c-" + str(i), "set_level", "fan", "low")
    assert len(device._acks) == 64
    assert "c-0" not in device._acks and "c-1" in device._acks
    command(device, "c-1", "set_level", "fan", "low")
    assert device.executions == 65, "c-1 is still remembered"
    command(device, "c-0", "set_level", "fan", "low")
    assert device.executions == 66, "c-0 was forgotten, so it executes again"


def test_get_state_answers_the_state_and_changes_nothing():
    device, board, _ = make_device("light")
    command(device, "c-1", "set_state", "power", True)
    ack = command(device, "c-2", "get_state")
    assert ack["ok"] is True
    assert ack["state"] == {"power": True, "brightness": 0, "color_temp": 2700, "firmware": "1.2.0"}
    assert len(board.applied) == 1 and device.executions == 1


# Clamping and refusals --------------------------------------------------------------------


def test_out_of_range_numbers_are_clamped_and_the_ack_says_so():
    device, board, _ = make_device("thermostat")
    ack = command(device, "c-1", "set_value", "target_temp", 35)
    assert ack["ok"] is True
    assert ack["state"]["target_temp"] == 30
    assert ack["clamped"] == {"actuator": "target_temp", "requested": 35, "applied": 30}
    ack = command(device, "c-2", "set_value", "target_temp", -4.5)
    assert ack["state"]["target_temp"] == 16 and ack["clamped"]["applied"] == 16
    assert board.applied == [("target_temp", 30, 1), ("target_temp", 16, 1)]


def test_numbers_are_rounded_half_up_to_the_step_and_the_ack_says_so():
    device, _, _ = make_device("thermostat")
    ack = command(device, "c-1", "set_value", "target_temp", 22.3)
    assert ack["state"]["target_temp"] == 22.5
    assert ack["clamped"] == {"actuator": "target_temp", "requested": 22.3, "applied": 22.5}
    ack = command(device, "c-2", "set_value", "target_temp", 22.5)
    assert ack["state"]["target_temp"] == 22.5 and "clamped" not in ack
    assert round_to_step(22.25, 16, 30, 0.5) == 22.5
    assert round_to_step(22.2, 16, 30, 0.5) == 22
    assert round_to_step(3049, 2700, 6500, 100) == 3000
    assert round_to_step(3050, 2700, 6500, 100) == 3100
    assert round_to_step(0.30000000000000004, 0, 1, 0.1) == 0.3
    # A range whose max is off the step grid never rounds past max.
    assert round_to_step(10, 0, 10, 4) == 8


def test_whole_numbers_come_back_as_integers():
    device, _, _ = make_device("light")
    ack = command(device, "c-1", "set_value", "brightness", 150)
    assert ack["state"]["brightness"] == 100 and type(ack["state"]["brightness"]) is int
    ack = command(device, "c-2", "set_value", "brightness", 40.0)
    assert ack["state"]["brightness"] == 40 and "clamped" not in ack


def test_enum_values_not_listed_are_refused_with_what_is_allowed():
    device, board, _ = make_device("env_fan")
    ack = command(device, "c-1", "set_level", "fan", "turbo")
    assert ack["ok"] is False
    assert ack["error"] == "value 'turbo' is not allowed for actuator 'fan'; allowed: off, low, mid, high"
    assert ack["state"]["fan"] == "off"
    assert board.applied == [] and device.executions == 0


def test_bools_take_true_or_false_only():
    device, board, _ = make_device("relay")
    for i, value in enumerate([1, "on", "true", 0]):
        ack = command(device, "c-" + str(i), "set_state", "relay", value)
        assert ack["ok"] is False, value
        assert "takes true or false" in ack["error"]
    ack = json.loads(device.handle_command('{"id": "c-n", "cmd": "set_state", "params": {"actuator": "relay", "value": null}}'))
    assert ack["ok"] is False
    assert board.applied == []
    assert command(device, "c-ok", "set_state", "relay", True)["state"]["relay"] is True


def test_colours_must_be_lower_case_rrggbb():
    device, board, _ = make_device("rgb_light")
    for i, value in enumerate(["#FF0000", "red", "#12345", "#1234567", "#gg0000", 16711680]):
        ack = command(device, "c-" + str(i), "set_color", "color", value)
        assert ack["ok"] is False, value
        assert "'#rrggbb' (lower-case hex)" in ack["error"]
    ack = command(device, "c-ok", "set_color", "color", "#ff8800")
    assert ack["ok"] is True and ack["state"]["color"] == "#ff8800"
    assert board.applied == [("color", "#ff8800", 1)]


def test_numbers_refuse_non_numbers():
    device, _, _ = make_device("blind")
    for i, value in enumerate(["50", True, [50], {"v": 50}]):
        ack = command(device, "c-" + str(i), "set_position", "position", value)
        assert ack["ok"] is False and "takes a number" in ack["error"], value
    assert command(device, "c-ok", "set_position", "position", 50)["state"]["position"] == 50


def test_a_counter_executes_the_difference_to_its_target_total():
    device, board, _ = make_device("pet_feeder")
    assert command(device, "c-1", "feed", "portions", 3)["state"]["portions"] == 3
    assert command(device, "c-2", "feed", "portions", 3)["state"]["portions"] == 3
    assert command(device, "c-3", "feed", "portions", 5)["state"]["portions"] == 5
    assert command(device, "c-4", "feed", "portions", 1)["state"]["portions"] == 5
    assert [units for (_, _, units) in board.applied] == [3, 0, 2, 0]
    assert sum(units for (_, _, units) in board.applied) == 5


def test_counter_targets_are_clamped_and_must_be_whole():
    device, _board, _ = make_device("pet_feeder")
    ack = command(device, "c-1", "feed", "portions", -2)
    assert ack["ok"] is True and ack["state"]["portions"] == 0
    assert ack["clamped"] == {"actuator": "portions", "requested": -2, "applied": 0}
    ack = command(device, "c-2", "feed", "portions", 2.5)
    assert ack["ok"] is False and "whole number" in ack["error"]
    assert command(device, "c-3", "feed", "portions", 2.0)["state"]["portions"] == 2
    ack = command(device, "c-4", "feed", "portions", 100001)
    assert ack["state"]["portions"] == 100000 and ack["clamped"]["applied"] == 100000


def test_a_counter_total_survives_a_power_cycle_so_a_repeat_feeds_nothing():
    flash = MemoryStore()
    device, _board, clock = make_device("pet_feeder", store=flash)
    command(device, "c-1", "feed", "portions", 3)
    rebooted, board2, _ = make_device("pet_feeder", store=flash, clock=clock)
    assert rebooted.state()["portions"] == 3
    ack = command(rebooted, "c-1", "feed", "portions", 3)  # the dedup memory is gone, the total is not
    assert ack["ok"] is True and board2.applied == [("portions", 3, 0)]


def test_the_firmware_updater_starts_at_the_running_version_and_lists_the_others():
    device, _, _ = make_device("lock")
    assert device.state()["firmware"] == "1.2.0"
    ack = command(device, "c-1", "set_version", "firmware", "9.9.9")
    assert ack["ok"] is False and ack["error"].endswith("allowed: 1.2.0, 1.3.0")


def test_unknown_commands_and_actuators_are_refused_with_the_choices():
    device, _, _ = make_device("thermostat")
    ack = command(device, "c-1", "toggle", "mode")
    assert ack["ok"] is False
    assert ack["error"] == "unknown command 'toggle'; commands: get_state, set_level, set_mode, set_value, set_version"
    ack = command(device, "c-2", "set_level", "fan2", "high")
    assert ack["error"] == "unknown actuator 'fan2'; actuators for set_level: fan_speed"
    ack = command(device, "c-3", "set_level", None, "high")
    assert ack["error"] == "missing params.actuator; actuators for set_level: fan_speed"
    ack = command(device, "c-4", "set_mode", "fan_speed", "high")
    assert ack["error"] == "actuator 'fan_speed' takes set_level, not set_mode"
    ack = command(device, "c-5", "set_level", "fan_speed")
    assert ack["error"] == "missing params.value for actuator 'fan_speed'"
    assert device.executions == 0 and device.errors == 5
    assert ack["state"]["fan_speed"] == "auto"


def test_malformed_commands_get_an_error_ack_and_the_device_keeps_working():
    device, board, _ = make_device("env_fan")
    cases = [
        (b"not json at all", None, "malformed command: not JSON"),
        (b"\xff\xfe{", None, "malformed command: not JSON"),
        (b"[1, 2]", None, "malformed command: not a JSON object"),
        (b'{"cmd": "get_state"}', None, "malformed command: 'id' must be a string of 1-64 characters"),
        (b'{"id": 7, "cmd": "get_state"}', None, "malformed command: 'id' must be a string of 1-64 characters"),
        (b'{"id": "", "cmd": "get_state"}', None, "malformed command: 'id' must be a string of 1-64 characters"),
        (('{"id": "' + "x" * 65 + '", "cmd": "get_state"}').encode(), None, "malformed command: 'id' must be"),
        (b'{"id": "c-1", "cmd": 5}', "c-1", "malformed command: 'cmd' must be a string"),
        (b'{"id": "c-2", "cmd": "set_level", "params": [1]}', "c-2", "malformed command: 'params' must be an object"),
        (b"{" + b" " * 5000 + b"}", None, "malformed command: larger than 4096 bytes"),
    ]
    for payload, expected_id, error in cases:
        ack = json.loads(device.handle_command(payload))
        assert ack["ok"] is False, payload
        assert ack["id"] == expected_id, payload
        assert ack["error"].startswith(error), ack["error"]
        assert ack["state"] == {"fan": "off", "firmware": "1.2.0"}
    assert board.applied == []
    assert command(device, "c-ok", "set_level", "fan", "low")["ok"] is True


def test_echoed_values_in_errors_are_bounded():
    device, _, _ = make_device("env_fan")
    ack = command(device, "c-1", "set_level", "fan", "z" * 1000)
    assert len(ack["error"]) < 200


# Debouncing and events --------------------------------------------------------------------


def test_a_contact_bouncing_for_20ms_yields_one_change():
    debouncer = Debouncer("door", "closed", quiet_ms=50)
    for t, level in [(1000, "open"), (1003, "closed"), (1007, "open"), (1012, "closed"), (1020, "open")]:
        debouncer.edge(level, t)
    assert debouncer.poll(1060) is None, "not settled for 50 ms yet"
    assert debouncer.poll(1070) == ("open", 1000)
    assert debouncer.poll(2000) is None
    assert debouncer.stable == "open"


def test_a_bounce_that_falls_back_yields_nothing():
    debouncer = Debouncer("door", "closed", quiet_ms=50)
    for t, level in [(1000, "open"), (1004, "closed"), (1009, "open"), (1015, "closed")]:
        debouncer.edge(level, t)
    assert debouncer.poll(1100) is None
    assert debouncer.stable == "closed" and debouncer.deadline() is None


def test_the_device_publishes_one_event_per_door_change_with_its_time_and_a_sequence():
    device, board, clock = make_device("door_contact", "front-door")
    board.change_input("door", "open", at_ms=1000, bounce_ms=20)
    board.change_input("door", "closed", at_ms=5000, bounce_ms=20)
    clock.run_until(device, 10000)
    events = [json.loads(p[1]) for p in device.transport.on("event")]
    epoch0 = clock.epoch_ms() - clock.ms()
    assert events == [
        {"ts": epoch0 + 1000, "event": "door", "value": "open", "seq": 1},
        {"ts": epoch0 + 5000, "event": "door", "value": "closed", "seq": 2},
    ]
    assert all(p[3] == 1 and p[2] is False for p in device.transport.on("event"))


def test_simulated_inputs_change_by_themselves_and_each_change_is_one_event():
    clock = ManualClock()
    contract = load_contract("door_contact")
    board = SimBoard(contract, "door-9", 3, "door_contact", clock.ms())
    device = Device(contract, "door-9", board, clock, prefix="t", telemetry_ms=60000)
    device.transport = FakeTransport()
    clock.run_until(device, 3600 * 1000)
    events = [json.loads(p[1]) for p in device.transport.on("event")]
    assert len(events) >= 3, "a door opens every few minutes in the simulation"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert all(events[i]["value"] != events[i + 1]["value"] for i in range(len(events) - 1)), "no duplicate changes"


# Telemetry ------------------------------------------------------------------------------


def test_the_ring_buffer_keeps_the_newest_samples_oldest_first():
    ring = RingBuffer(3)
    for i in range(5):
        ring.push(i)
    assert ring.items() == [2, 3, 4] and ring.dropped == 2 and len(ring) == 3
    ring.clear()
    assert ring.items() == []


def test_telemetry_is_periodic_timestamped_and_covers_every_sensor():
    device, _, clock = make_device("env_fan", telemetry_ms=1000)
    clock.run_until(device, 5500)
    messages = device.transport.on("telemetry")
    assert len(messages) == 5
    assert all(m[2] is False and m[3] == 0 for m in messages)
    bodies = [json.loads(m[1]) for m in messages]
    epoch0 = clock.epoch_ms() - clock.ms()
    assert [b["ts"] - epoch0 for b in bodies] == [1000, 2000, 3000, 4000, 5000]
    for body in bodies:
        assert [s["metric"] for s in body["samples"]] == ["temperature", "humidity", "rssi"]
        assert all(s["ts"] == body["ts"] for s in body["samples"])
        assert all(-40 <= s["value"] <= 85 for s in body["samples"] if s["metric"] == "temperature")


def test_the_scale_sends_its_ring_buffer_of_timestamped_samples():
    device, _, clock = make_device("scale", telemetry_ms=1000)
    clock.run_until(device, 2100)
    bodies = [json.loads(m[1]) for m in device.transport.on("telemetry")]
    assert len(bodies) == 2
    weights = [s for s in bodies[1]["samples"] if s["metric"] == "weight"]
    epoch0 = clock.epoch_ms() - clock.ms()
    assert [s["ts"] - epoch0 for s in weights] == [1200, 1400, 1600, 1800, 2000]
    assert all(1200 < s["value"] < 1300 for s in weights)


def test_samples_wait_in_the_bounded_ring_while_the_link_is_down():
    device, _, clock = make_device("scale", telemetry_ms=1000)
    device.transport.up = False
    clock.run_until(device, 30000)  # 150 weight samples taken; the ring holds 60
    device.transport.up = True
    clock.run_until(device, 31000)
    bodies = [json.loads(m[1]) for m in device.transport.on("telemetry")]
    assert len(bodies) == 1
    weights = [s for s in bodies[0]["samples"] if s["metric"] == "weight"]
    assert len(weights) == 60
    epoch0 = clock.epoch_ms() - clock.ms()
    assert weights[-1]["ts"] - epoch0 == 31000 and weights[0]["ts"] - epoch0 == 31000 - 59 * 200


def test_noise_is_deterministic_for_a_seed():
    def readings(seed):
        device, _, clock = make_device("thermostat", "ac-1", seed=seed, telemetry_ms=1000)
        clock.run_until(device, 10000)
        return [json.loads(m[1])["samples"] for m in device.transport.on("telemetry")]

    assert readings(1) == readings(1)
    assert readings(1) != readings(2)


def test_the_prng_gives_the_same_numbers_on_every_interpreter():
    rng = Rng(42)
    assert [rng.next_u32() for _ in range(4)] == [11355432, 2836018348, 476557059, 3648046016]
    assert fnv1a("kitchen-env") == 1463602809
    seeded = Rng.for_device(7, "dev-1", "sensor/temperature")
    assert seeded.randint(0, 1000) == 198
    assert 0.0 <= seeded.random() < 1.0


def test_every_catalog_device_boots_connects_and_reports():
    assert len(TYPES) >= 12
    for device_type in TYPES:
        device, _, clock = make_device(device_type, "x-" + device_type.replace("_", "-"), telemetry_ms=1000)
        device.on_connect()
        clock.run_until(device, 1000)
        assert len(device.transport.on("info")) == 1, device_type
        assert len(device.transport.on("telemetry")) == 1, device_type
        assert command(device, "c-1", "get_state")["ok"] is True


def test_simulated_outputs_shape_the_readings():
    valve, _, clock = make_device("water_valve", telemetry_ms=1000)
    clock.run_until(valve, 1000)
    command(valve, "c-1", "set_state", "open", True)
    clock.run_until(valve, 2000)
    flows = [next(s["value"] for s in json.loads(m[1])["samples"] if s["metric"] == "flow") for m in valve.transport.on("telemetry")]
    assert flows[0] == 0 and flows[1] > 3, "no flow through a closed valve"
    sensor, _, clock = make_device("sht30", telemetry_ms=1000)
    clock.run_until(sensor, 1000)
    command(sensor, "c-1", "set_state", "heater", True)
    clock.run_until(sensor, 2000)
    temps = [next(s["value"] for s in json.loads(m[1])["samples"] if s["metric"] == "temperature") for m in sensor.transport.on("telemetry")]
    assert temps[1] - temps[0] > 2.5, "an SHT30 reads warm while its heater runs"



def test_a_leak_probe_reads_dry_until_it_is_made_wet():
    probe, board, clock = make_device("leak_probe", "leak-probe", telemetry_ms=1000)
    clock.run_until(probe, 1000)
    board.set_sensor("wet", True)
    clock.run_until(probe, 2000)
    board.set_sensor("wet", False)
    clock.run_until(probe, 3000)
    wet = [next(s["value"] for s in json.loads(m[1])["samples"] if s["metric"] == "wet") for m in probe.transport.on("telemetry")]
    assert wet == [False, True, False]


def test_a_change_at_the_device_itself_is_reported_as_a_state_event():
    device, _, _ = make_device("env_fan", "kitchen-env")
    device.set_locally("fan", "mid")
    events = [json.loads(p[1]) for p in device.transport.on("event")]
    assert [(e["event"], e["value"], e["state"]["fan"]) for e in events] == [("state", "local", "mid")]
    assert device.executions == 0 and device.local_changes == 1

"""The firmware's on-time limit (max_on_seconds): the actuator goes off by itself after that long on, with no I/O.

Like test_firmware_failsafe.py, these tests run twice: under CPython (pytest) and on the real MicroPython
interpreter (tests/unit/test_firmware_micropython.py loads this file into the WebAssembly port and calls
every test_ function). So this file must be MicroPython code: plain functions and asserts, no pytest, no
`from __future__`, only corral_fw imports. The clock is a ManualClock: time moves only when a test says; no
controller (heartbeat) is involved anywhere, which is the point.
"""

import json

from corral_fw.actuators import make_actuator, max_on_of
from corral_fw.clock import ManualClock
from corral_fw.contracts.relay import CONTRACT as RELAY
from corral_fw.contracts.space_heater import CONTRACT as HEATER
from corral_fw.device import Device
from corral_fw.simboard import SimBoard

RELAY_LIMIT_MS = 4 * 3600 * 1000  # the catalog relay: 4 h
HEATER_LIMIT_MS = 2 * 3600 * 1000  # the catalog space heater: 2 h


class FakeTransport:
    def __init__(self):
        self.published = []
        self.subscribed = []

    def publish(self, topic, payload, retain, qos):
        self.published.append((topic, payload, retain, qos))
        return True

    def subscribe(self, topic, qos):
        self.subscribed.append((topic, qos))

    def events(self, value=None):
        found = [json.loads(p[1]) for p in self.published if p[0].endswith("/event")]
        return [e for e in found if value is None or e.get("value") == value]


def make(contract, device_type, device_id, clock=None):
    clock = clock or ManualClock()
    board = SimBoard(contract, device_id, 7, device_type, clock.ms(), auto_inputs=False)
    device = Device(contract, device_id, board, clock, prefix="t", telemetry_ms=3600000)
    device.transport = FakeTransport()
    return device, board, clock


def command(device, command_id, cmd, actuator, value):
    return json.loads(device.handle_command(json.dumps(
        {"id": command_id, "cmd": cmd, "params": {"actuator": actuator, "value": value}})))


def relay(device, command_id, value):
    ack = command(device, command_id, "set_state", "relay", value)
    assert ack["ok"], ack
    return ack


def run_until(device, clock, until_ms):
    """Tick as an owner would: at each wake-up the device asks for, up to until_ms."""
    while True:
        wake = device.next_wakeup(clock.ms())
        if wake > until_ms:
            clock.advance(until_ms - clock.ms())
            device.tick(clock.ms())
            return
        clock.advance(max(0, wake - clock.ms()))
        device.tick(clock.ms())


def relay_applies(board):
    return [a[1] for a in board.applied if a[0] == "relay"]


def with_relay_limit(seconds):
    """The catalog relay with another max_on_seconds (a firmware built from a modified contract)."""
    contract = {}
    for key in RELAY:
        contract[key] = RELAY[key]
    actuators = []
    for spec in RELAY["actuators"]:
        if spec["id"] == "relay":
            spec = dict(spec)
            spec["max_on_seconds"] = seconds
        actuators.append(spec)
    contract["actuators"] = actuators
    return contract


def test_the_relay_goes_off_by_itself_after_its_limit_with_no_controller():
    device, board, clock = make(RELAY, "relay", "relay-1")
    relay(device, "on-1", True)
    run_until(device, clock, RELAY_LIMIT_MS - 1)
    assert device.state()["relay"] is True and relay_applies(board) == [True]
    run_until(device, clock, RELAY_LIMIT_MS)
    assert device.state()["relay"] is False and relay_applies(board) == [True, False]
    assert device.limits_applied == 1
    events = device.transport.events("max_on")
    assert len(events) == 1
    event = events[0]
    assert event["state"]["relay"] is False
    record = event["max_on"]["relay"]
    assert record["value"] is False and record["on_ms"] == RELAY_LIMIT_MS and record["max_on_s"] == 14400
    assert "error" not in record and record["ts"] > 0


def test_every_ack_says_so_until_the_actuator_is_set_again():
    device, _board, clock = make(with_relay_limit(5), "relay", "relay-1")
    relay(device, "on-1", True)
    run_until(device, clock, 5000)
    state_ack = json.loads(device.handle_command('{"id": "g-1", "cmd": "get_state"}'))
    assert state_ack["state"]["relay"] is False and state_ack["max_on"]["relay"]["max_on_s"] == 5
    ack = relay(device, "on-2", True)  # someone switches it on again: a new on period, no record any more
    assert "max_on" not in ack and device.max_on_state == {}


def test_a_repeated_on_command_does_not_extend_the_limit():
    device, board, clock = make(with_relay_limit(10), "relay", "relay-1")
    relay(device, "on-1", True)
    run_until(device, clock, 6000)
    relay(device, "on-2", True)  # asked again while on: the clock keeps running from the first
    run_until(device, clock, 9999)
    assert device.state()["relay"] is True
    run_until(device, clock, 10000)
    assert device.state()["relay"] is False
    assert device.transport.events("max_on")[0]["max_on"]["relay"]["on_ms"] == 10000
    assert relay_applies(board) == [True, True, False]


def test_going_off_restarts_the_clock():
    device, _board, clock = make(with_relay_limit(10), "relay", "relay-1")
    relay(device, "on-1", True)
    run_until(device, clock, 8000)
    relay(device, "off-1", False)
    relay(device, "on-2", True)  # a new on period from 8 s: off at 18 s, not at 10 s
    run_until(device, clock, 17999)
    assert device.state()["relay"] is True and device.limits_applied == 0
    run_until(device, clock, 18000)
    assert device.state()["relay"] is False and device.limits_applied == 1


def test_a_local_change_counts_like_a_command():
    device, _board, clock = make(with_relay_limit(3), "relay", "relay-1")
    device.set_locally("relay", True)  # the button on the device
    run_until(device, clock, 3000)
    assert device.state()["relay"] is False and device.transport.events("max_on")[0]["max_on"]["relay"]


def test_an_off_relay_never_trips_and_the_wakeup_follows_the_clock():
    device, board, clock = make(with_relay_limit(5), "relay", "relay-1")
    assert device.next_wakeup(clock.ms()) > 5000  # off: nothing due (the telemetry period is an hour)
    run_until(device, clock, 20000)
    assert relay_applies(board) == [] and device.limits_applied == 0
    relay(device, "on-1", True)
    assert device.next_wakeup(clock.ms()) == 25000


def test_the_heater_goes_off_after_two_hours_whatever_its_level():
    device, board, clock = make(HEATER, "space_heater", "heater-1")
    # Its failsafe (off after 60 s without the controller) would act first: keep a controller alive here.
    def beat(seq):
        device.on_message("t/_corral/heartbeat", json.dumps({"state": "alive", "seq": seq}).encode())
    beat(0)
    ack = command(device, "low-1", "set_level", "power", "low")
    assert ack["ok"] and board.read("load") > 500
    seq = 1
    while clock.ms() < HEATER_LIMIT_MS - 20000:
        clock.advance(20000)
        beat(seq)
        seq += 1
        device.tick(clock.ms())
        if seq == 100:
            assert command(device, "high-1", "set_level", "power", "high")["ok"]  # another on value: same clock
    assert device.state()["power"] == "high"
    while device.state()["power"] != "off":
        clock.advance(1000)
        beat(seq)
        seq += 1
        device.tick(clock.ms())
    assert clock.ms() == HEATER_LIMIT_MS and device.failsafes_applied == 0
    assert device.transport.events("max_on")[0]["max_on"]["power"]["value"] == "off"
    assert board.read("load") == 0


def test_a_jammed_relay_reports_the_failure_and_is_tried_again():
    device, board, clock = make(with_relay_limit(5), "relay", "relay-1")
    relay(device, "on-1", True)
    board.jam("relay")
    run_until(device, clock, 5000)
    failed = device.transport.events("max_on")
    assert len(failed) == 1 and "jammed" in failed[0]["max_on"]["relay"]["error"]
    assert device.state()["relay"] is True and device.max_on_state == {}
    board.jam("relay", False)
    run_until(device, clock, 9999)
    assert device.state()["relay"] is True  # the next try is one limit (5 s, under a minute) later
    run_until(device, clock, 10000)
    assert device.state()["relay"] is False and device.max_on_state["relay"]["on_ms"] == 10000


def test_a_limit_the_model_would_refuse_refuses_to_build():
    for spec, word in (
        ({"id": "x", "type": "bool", "action": "set_state", "max_on_seconds": 0.5}, "from 1 to 86400"),
        ({"id": "x", "type": "bool", "action": "set_state", "max_on_seconds": "1h"}, "from 1 to 86400"),
        ({"id": "x", "type": "enum", "values": ["a", "b"], "action": "set_mode", "max_on_seconds": 60}, "off value"),
    ):
        try:
            max_on_of(make_actuator(spec))
        except ValueError as err:
            assert word in str(err), str(err)
        else:
            raise AssertionError(spec)
    assert max_on_of(make_actuator({"id": "x", "type": "bool", "action": "set_state"})) is None
    heater = make_actuator(HEATER["actuators"][0])
    assert max_on_of(heater) == ("off", HEATER_LIMIT_MS)


def test_the_simulated_heaters_load_and_warmth_follow_its_setting():
    device, board, _clock = make(HEATER, "space_heater", "heater-1")
    assert board.read("load") == 0
    cold = board.read("temperature")
    for level, low, high in (("low", 900, 1100), ("high", 1900, 2100)):
        assert command(device, "set-" + level, "set_level", "power", level)["ok"]
        assert low <= board.read("load") <= high, level
    assert board.read("temperature") > cold + 1.5  # its boost: the air at the intake warms while it runs
    assert command(device, "off", "set_level", "power", "off")["ok"]
    assert board.read("load") == 0 and board.read("temperature") < cold + 1.5


def test_a_reboot_does_not_forget_that_the_limit_acted():
    from corral_fw.store import MemoryStore

    flash = MemoryStore()
    clock = ManualClock()
    contract = with_relay_limit(5)
    board = SimBoard(contract, "relay-1", 7, "relay", clock.ms(), auto_inputs=False)
    device = Device(contract, "relay-1", board, clock, prefix="t", telemetry_ms=3600000, store=flash)
    device.transport = FakeTransport()
    relay(device, "on-1", True)
    run_until(device, clock, 5000)
    record = device.max_on_state["relay"]
    rebooted, _board, _clock = make(contract, "relay", "relay-1", clock)
    assert rebooted.max_on_state == {}, "no store: nothing to remember"
    board2 = SimBoard(contract, "relay-1", 7, "relay", clock.ms(), auto_inputs=False)
    rebooted = Device(contract, "relay-1", board2, clock, prefix="t", telemetry_ms=3600000, store=flash)
    rebooted.transport = FakeTransport()
    rebooted.on_connect()
    assert rebooted.transport.events("connect")[0]["max_on"] == {"relay": record}
    ack = json.loads(rebooted.handle_command('{"id": "g-1", "cmd": "get_state"}'))
    assert ack["state"]["relay"] is False and ack["max_on"]["relay"] == record
    relay(rebooted, "on-2", True)  # set again: forgotten, in the store too
    assert rebooted.max_on_state == {} and "max_on" not in flash.load()

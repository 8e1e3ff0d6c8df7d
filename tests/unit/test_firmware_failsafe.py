"""The firmware's failsafe: the controller's heartbeat, the countdown, and the failsafe value, with no I/O.

Like test_firmware_core.py, these tests run twice: under CPython (pytest) and on the real MicroPython
interpreter (tests/unit/test_firmware_micropython.py loads this file into the WebAssembly port and calls
every test_ function). So this file must be MicroPython code: plain functions and asserts, no pytest, no
`from __future__`, only corral_fw imports. The clock is a ManualClock: time moves only when a test says.
"""

import json

from corral_fw.actuators import failsafe_of, make_actuator
from corral_fw.clock import ManualClock
from corral_fw.contracts.sht30 import CONTRACT as SHT30
from corral_fw.device import Device
from corral_fw.simboard import SimBoard

HEARTBEAT = "t/_corral/heartbeat"
DELAY_MS = 30000  # the SHT30 heater's failsafe in the catalog: false after 30 s


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


def make_sensor(contract=None, clock=None, telemetry_ms=60000):
    clock = clock or ManualClock()
    contract = contract or SHT30
    board = SimBoard(contract, "sht-1", 7, "sht30", clock.ms(), auto_inputs=False)
    device = Device(contract, "sht-1", board, clock, prefix="t", telemetry_ms=telemetry_ms)
    device.transport = FakeTransport()
    return device, board, clock


def heater_on(device, command_id="c-1"):
    ack = json.loads(device.handle_command(json.dumps(
        {"id": command_id, "cmd": "set_state", "params": {"actuator": "heater", "value": True}})))
    assert ack["ok"] and ack["state"]["heater"] is True
    return ack


def beat(device, seq, retained=False):
    device.on_message(HEARTBEAT, json.dumps({"state": "alive", "seq": seq, "ts": 1764500000000}).encode(), retained)


def gone(device):
    device.on_message(HEARTBEAT, b'{"state": "gone"}', True)


def heater_applies(board):
    return [a for a in board.applied if a[0] == "heater"]


def with_heater_failsafe(failsafe):
    """The SHT30 contract with another failsafe on its heater (or none, for failsafe None)."""
    contract = {}
    for key in SHT30:
        contract[key] = SHT30[key]
    actuators = []
    for spec in SHT30["actuators"]:
        if spec["id"] == "heater":
            spec = dict(spec)
            if failsafe is None:
                spec.pop("failsafe")
            else:
                spec["failsafe"] = failsafe
        actuators.append(spec)
    contract["actuators"] = actuators
    return contract


# The contract ---------------------------------------------------------------------------


def test_the_catalog_heater_fails_safe_to_off_after_30_s():
    heater = make_actuator(SHT30["actuators"][0])
    assert heater.id == "heater"
    assert failsafe_of(heater) == (False, DELAY_MS)
    assert failsafe_of(make_actuator(SHT30["actuators"][1])) is None


def test_a_failsafe_that_is_not_a_plain_value_of_its_actuator_refuses_to_build():
    number = {"id": "level", "name": "Level", "type": "number", "action": "set_value", "risk": "low",
              "level": "write", "range": {"min": 0, "max": 100}, "step": 5}
    counter = {"id": "feed", "name": "Feed", "type": "counter", "action": "feed", "risk": "low", "level": "write",
               "range": {"min": 0, "max": 1000}}
    bad = [
        with_heater_failsafe({"value": 0, "delay_s": 30}),  # not a bool
        with_heater_failsafe({"value": "off", "delay_s": 30}),
        with_heater_failsafe({"value": False, "delay_s": 0.5}),  # too short
        with_heater_failsafe({"value": False, "delay_s": 86401}),  # too long
        with_heater_failsafe({"value": False}),
        with_heater_failsafe(False),
    ]
    for contract in bad:
        try:
            make_sensor(contract)
        except ValueError as err:
            assert "failsafe" in str(err)
        else:
            raise AssertionError("built with a bad failsafe: " + json.dumps(contract["actuators"][0]))
    for spec, failsafe in ((number, {"value": 12, "delay_s": 5}), (number, {"value": 150, "delay_s": 5}),
                           (counter, {"value": 0, "delay_s": 5})):
        spec = dict(spec)
        spec["failsafe"] = failsafe
        try:
            failsafe_of(make_actuator(spec))
        except ValueError:
            pass
        else:
            raise AssertionError("accepted " + json.dumps(spec))
    number = dict(number)
    number["failsafe"] = {"value": 10, "delay_s": 2.5}
    assert failsafe_of(make_actuator(number)) == (10, 2500)


def test_a_device_with_a_failsafe_listens_to_the_heartbeat_and_one_without_does_not():
    device, _, _ = make_sensor()
    device.on_connect()
    assert device.transport.subscribed == [("t/sht-1/cmd", 1), (HEARTBEAT, 0)]
    plain, _, _ = make_sensor(with_heater_failsafe(None))
    plain.on_connect()
    assert plain.transport.subscribed == [("t/sht-1/cmd", 1)]


# The countdown --------------------------------------------------------------------------


def test_heartbeats_keep_the_heater_on():
    device, board, clock = make_sensor()
    heater_on(device)
    for seq in range(1, 61):  # two minutes of beats every 2 s
        clock.advance(2000)
        beat(device, seq)
        clock.run_until(device, clock.now)
    assert device.state()["heater"] is True
    assert heater_applies(board) == [("heater", True, 1)]
    assert device.heartbeats == 60 and device.failsafes_applied == 0


def test_the_failsafe_comes_at_its_delay_after_the_last_heartbeat_never_before_and_once():
    device, board, clock = make_sensor()
    heater_on(device)
    clock.advance(2000)
    beat(device, 1)
    last = clock.now
    assert device.next_wakeup(clock.now) == last + DELAY_MS, "a sleeping device must wake for the failsafe"
    clock.run_until(device, last + DELAY_MS - 1)
    assert device.state()["heater"] is True, "not a millisecond before the delay"
    assert device.transport.events("failsafe") == []
    clock.run_until(device, last + DELAY_MS)
    assert device.state()["heater"] is False
    assert heater_applies(board) == [("heater", True, 1), ("heater", False, 1)]
    events = device.transport.events("failsafe")
    assert len(events) == 1
    event = events[0]
    assert event["event"] == "state" and event["state"]["heater"] is False
    assert event["failsafe"] == {"heater": {"value": False, "heartbeat_lost_ms": DELAY_MS, "controller": "silent",
                                            "ts": clock.epoch_ms()}}
    clock.run_until(device, last + 10 * DELAY_MS)
    assert len(heater_applies(board)) == 2 and len(device.transport.events("failsafe")) == 1, "once per loss"
    assert device.failsafes_applied == 1


def test_the_controllers_will_names_the_cause_and_the_clock_still_runs_from_the_last_heartbeat():
    device, _, clock = make_sensor()
    heater_on(device)
    clock.advance(1000)
    beat(device, 1)
    last = clock.now
    clock.advance(1500)
    gone(device)  # the broker publishes the Will as soon as it notices: at once after a SIGKILL
    assert device.next_wakeup(clock.now) == last + DELAY_MS
    clock.run_until(device, last + DELAY_MS - 1)
    assert device.state()["heater"] is True
    clock.run_until(device, last + DELAY_MS)
    assert device.state()["heater"] is False
    assert device.transport.events("failsafe")[0]["failsafe"]["heater"]["controller"] == "gone"


def test_a_will_seen_at_boot_starts_the_clock_at_once():
    device, _, clock = make_sensor()
    device.on_connect()
    gone(device)  # retained: the controller died before this device booted
    device.set_locally("heater", True)
    clock.run_until(device, DELAY_MS - 1)
    assert device.state()["heater"] is True
    clock.run_until(device, DELAY_MS)
    assert device.state()["heater"] is False
    assert device.transport.events("failsafe")[0]["failsafe"]["heater"]["controller"] == "gone"


def test_retained_heartbeats_do_not_count_as_alive():
    device, _, clock = make_sensor()
    device.set_locally("heater", True)
    for second in range(0, 30, 2):
        clock.now = second * 1000
        device.on_message(HEARTBEAT, b'{"state": "alive", "ts": 1764500000000}', True)  # what the controller retains
        device.on_message(HEARTBEAT, b'{"state": "alive", "ts": 1764500000000}', False)  # no seq: not a beat
        beat(device, second, retained=True)  # a beat with the retain flag: an old one
        clock.run_until(device, clock.now)
    assert device.heartbeats == 0
    clock.run_until(device, DELAY_MS)
    assert device.state()["heater"] is False, "with no live beat since boot the countdown ran from boot"
    assert device.transport.events("failsafe")[0]["failsafe"]["heater"]["controller"] == "unseen"


def test_junk_on_the_heartbeat_topic_counts_for_nothing():
    device, _, clock = make_sensor()
    device.set_locally("heater", True)
    for junk in (b"not json", b"[1, 2]", b'"alive"', b'{"state": "alive", "seq": 1' + b" " * 600 + b"}", b"\xff\xfe"):
        clock.advance(2000)
        device.on_message(HEARTBEAT, junk)
    assert device.heartbeats == 0
    clock.run_until(device, DELAY_MS)
    assert device.state()["heater"] is False


def test_a_heartbeat_stops_the_countdown_and_the_firmware_does_not_restore_the_old_value():
    device, board, clock = make_sensor()
    heater_on(device)
    clock.run_until(device, DELAY_MS)
    assert device.state()["heater"] is False
    clock.advance(5000)
    beat(device, 1)  # the controller is back
    clock.run_until(device, clock.now + 10 * DELAY_MS)
    assert device.state()["heater"] is False, "the controller drives the target again, not the firmware"
    assert len(heater_applies(board)) == 2


def test_a_new_loss_trips_the_failsafe_again():
    device, board, clock = make_sensor()
    heater_on(device, "c-1")
    clock.run_until(device, DELAY_MS)
    clock.advance(1000)
    beat(device, 1)
    heater_on(device, "c-2")  # driven again by the controller
    last = clock.now
    clock.run_until(device, last + DELAY_MS - 1)
    assert device.state()["heater"] is True
    clock.run_until(device, last + DELAY_MS)
    assert device.state()["heater"] is False
    assert [a[1] for a in heater_applies(board)] == [True, False, True, False]
    assert device.failsafes_applied == 2


def test_a_heater_turned_on_again_during_the_same_loss_is_left_alone():
    device, _, clock = make_sensor()
    heater_on(device, "c-1")
    clock.run_until(device, DELAY_MS)
    heater_on(device, "c-2")  # someone who can still reach it (no heartbeat: the loss goes on)
    clock.run_until(device, 3 * DELAY_MS)
    assert device.state()["heater"] is True
    assert device.failsafes_applied == 1


def test_a_heater_already_off_needs_no_failsafe_and_nothing_is_reported():
    device, board, clock = make_sensor()
    clock.run_until(device, 2 * DELAY_MS)
    assert heater_applies(board) == [] and device.transport.events("failsafe") == []
    assert device.failsafe_state == {}


def test_acks_and_state_events_say_which_actuator_sits_at_its_failsafe_value_until_it_is_set_again():
    device, _, clock = make_sensor()
    heater_on(device)
    clock.run_until(device, DELAY_MS)
    ack = json.loads(device.handle_command(json.dumps({"id": "g-1", "cmd": "get_state", "params": {}})))
    assert ack["state"]["heater"] is False
    assert ack["failsafe"]["heater"]["value"] is False
    assert ack["failsafe"]["heater"]["heartbeat_lost_ms"] == DELAY_MS
    device.on_connect()  # a reconnect: its state event carries the failsafe too
    assert device.transport.events("connect")[-1]["failsafe"]["heater"]["controller"] == "unseen"
    clock.advance(1000)
    beat(device, 1)
    ack = heater_on(device, "c-2")
    assert "failsafe" not in ack


def test_a_jammed_actuator_is_reported_with_the_failure():
    device, board, clock = make_sensor()
    heater_on(device)
    board.jam("heater")
    clock.run_until(device, DELAY_MS)
    assert device.state()["heater"] is True
    event = device.transport.events("failsafe")[0]
    assert "jammed" in event["failsafe"]["heater"]["error"]
    assert device.failsafe_state == {} and device.errors == 1
    clock.run_until(device, 3 * DELAY_MS)
    assert len(device.transport.events("failsafe")) == 1, "once per loss, failed or not"


def test_a_short_delay_from_a_contract_is_kept_to_the_millisecond():
    device, _, clock = make_sensor(with_heater_failsafe({"value": False, "delay_s": 3}), telemetry_ms=1000)
    heater_on(device)
    clock.advance(500)
    beat(device, 1)
    clock.run_until(device, 3499)
    assert device.state()["heater"] is True
    clock.run_until(device, 3500)
    assert device.state()["heater"] is False


def test_a_heartbeat_after_a_loss_re_arms_a_deadline_its_owner_must_wake_for():
    device, _, clock = make_sensor(telemetry_ms=600000)
    clock.run_until(device, DELAY_MS)  # no controller since boot: the heater (off already) was handled
    assert device.next_wakeup(clock.now) == 600000, "only the next sample is due"
    clock.advance(1000)
    beat(device, 1)
    assert device.next_wakeup(clock.now) == clock.now + DELAY_MS, "after a message, ask again: it may be sooner"

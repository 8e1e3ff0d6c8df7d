"""The firmware's epoch check, with no I/O: a controller replica that lost a device cannot drive it any more.

With several controller replicas (issue 31), each command may carry `"epoch"`: the sending replica's hold on the
device's shard. The device keeps the highest epoch it has seen and refuses a lower one, naming it; a command
without an epoch is accepted; a resent id still gets its stored ack (docs/protocol.md, "Epoch").

Like test_firmware_core.py, these tests run twice: under CPython (pytest) and on the real MicroPython
interpreter (tests/unit/test_firmware_micropython.py loads this file into the WebAssembly port and calls every
test_ function). So this file must be MicroPython code: plain functions and asserts, no pytest, no
`from __future__`, only corral_fw imports.
"""

import json

from corral_fw.clock import ManualClock
from corral_fw.contracts.relay import CONTRACT as RELAY
from corral_fw.device import Device
from corral_fw.simboard import SimBoard

# Lease acquire times in ms, as the controller sends them: larger than 2**31, as a board's ints must hold.
OLD = 1764500000000
NEW = 1764500012345


class FakeTransport:
    def __init__(self):
        self.published = []

    def publish(self, topic, payload, retain, qos):
        self.published.append((topic, payload, retain, qos))
        return True

    def subscribe(self, topic, qos):
        pass


def make_relay():
    clock = ManualClock()
    board = SimBoard(RELAY, "relay-1", 7, "relay", clock.ms(), auto_inputs=False)
    device = Device(RELAY, "relay-1", board, clock, prefix="t")
    device.transport = FakeTransport()
    return device, board


def moves(board):
    """What the hardware did: (actuator, value) for each apply, without its units."""
    return [(applied[0], applied[1]) for applied in board.applied]


def switch(device, command_id, value, epoch=None):
    command = {"id": command_id, "cmd": "set_state", "params": {"actuator": "relay", "value": value}}
    if epoch is not None:
        command["epoch"] = epoch
    return json.loads(device.handle_command(json.dumps(command)))


def test_a_command_with_a_lower_epoch_is_refused_naming_it_and_moves_nothing():
    device, board = make_relay()
    assert switch(device, "c-new", True, NEW)["ok"]
    ack = switch(device, "c-old", False, OLD)
    assert not ack["ok"]
    assert ack["id"] == "c-old"
    assert "stale epoch " + str(OLD) in ack["error"] and str(NEW) in ack["error"], ack["error"]
    assert ack["stale_epoch"] == {"sent": OLD, "seen": NEW}
    assert ack["state"]["relay"] is True, "the ack still carries the full state"
    assert moves(board) == [("relay", True)], "the hardware moved once, for the newer epoch only"
    assert device.stale_epochs == 1 and device.executions == 1
    assert device.epoch == NEW


def test_the_highest_epoch_wins_and_equal_or_higher_ones_are_accepted():
    device, _ = make_relay()
    assert switch(device, "c-1", True, OLD)["ok"]
    assert switch(device, "c-2", False, OLD)["ok"], "the same holder sends again"
    assert switch(device, "c-3", True, NEW)["ok"], "a new holder takes over"
    assert device.epoch == NEW
    assert not switch(device, "c-4", False, OLD)["ok"], "the old holder is turned away from now on"
    assert switch(device, "c-5", False, NEW + 1)["ok"]
    assert not switch(device, "c-6", True, NEW)["ok"]
    assert device.stale_epochs == 2


def test_a_command_without_an_epoch_is_accepted_and_changes_no_epoch():
    device, board = make_relay()
    assert switch(device, "c-1", True)["ok"], "a controller alone sends no epoch"
    assert device.epoch is None
    assert switch(device, "c-2", False, OLD)["ok"]
    assert switch(device, "c-3", True)["ok"], "no epoch is never stale"
    assert device.epoch == OLD and device.stale_epochs == 0
    assert len(board.applied) == 3


def test_a_resent_id_gets_its_stored_ack_whatever_its_epoch_and_acts_once():
    device, board = make_relay()
    first = json.dumps({"id": "i-abc", "cmd": "set_state", "params": {"actuator": "relay", "value": True}, "epoch": OLD})
    stored = device.handle_command(first)
    # The new owner resumes the Intent with the same command id and its own, newer epoch: the old answer.
    resent = json.dumps({"id": "i-abc", "cmd": "set_state", "params": {"actuator": "relay", "value": True}, "epoch": NEW})
    assert device.handle_command(resent) == stored
    assert device.duplicates == 1 and moves(board) == [("relay", True)]
    assert device.epoch == NEW, "a resend still tells the device who holds it now"
    # The old owner resending its own id also gets the stored ack, as any resend does.
    assert device.handle_command(first) == stored
    assert device.stale_epochs == 0


def test_a_stale_refusal_is_not_remembered_so_the_new_owner_can_send_that_id():
    device, board = make_relay()
    assert switch(device, "c-new", True, NEW)["ok"]
    assert not switch(device, "i-shared", False, OLD)["ok"]
    ack = switch(device, "i-shared", False, NEW)
    assert ack["ok"] and ack["state"]["relay"] is False, ack
    assert device.duplicates == 0
    assert moves(board) == [("relay", True), ("relay", False)]


def test_a_malformed_epoch_is_refused_with_what_is_allowed():
    device, board = make_relay()
    for bad in ("12", -1, 1.5, True, [1]):
        ack = json.loads(device.handle_command(json.dumps(
            {"id": "c-bad", "cmd": "set_state", "params": {"actuator": "relay", "value": True}, "epoch": bad})))
        assert not ack["ok"] and ack["id"] == "c-bad"
        assert ack["error"] == "malformed command: 'epoch' must be a whole number >= 0 (or absent)", ack["error"]
    assert board.applied == [] and device.epoch is None and device.stale_epochs == 0
    assert switch(device, "c-bad", True, OLD)["ok"], "a malformed command was not remembered under its id"


def test_the_epoch_lives_in_ram_only_a_reboot_forgets_it():
    device, _ = make_relay()
    assert switch(device, "c-1", True, NEW)["ok"]
    rebooted, _ = make_relay()
    assert rebooted.epoch is None
    assert switch(rebooted, "c-2", False, OLD)["ok"]


def test_a_stale_ack_goes_out_on_the_ack_topic_like_any_other():
    device, _ = make_relay()
    assert switch(device, "c-new", True, NEW)["ok"]
    payload = json.dumps({"id": "c-old", "cmd": "set_state", "params": {"actuator": "relay", "value": False},
                          "epoch": OLD})
    device.on_message(device.topic_cmd, payload.encode())
    topic, sent, retain, qos = device.transport.published[-1]
    assert topic == "t/relay-1/ack" and not retain and qos == 1
    assert json.loads(sent)["stale_epoch"] == {"sent": OLD, "seen": NEW}

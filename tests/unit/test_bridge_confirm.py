"""The bridge's confirmation rule (only a new, non-retained state after the publish, within the timeout, confirms) and
its answers to `cmd` (commands.py)."""

from __future__ import annotations

import json

from corral.bridge.commands import Answer, Commands, Execute
from corral.bridge.confirm import UNKNOWN, Confirmation, Confirmed, NotConfirmed
from corral.contract.model import Contract


def waiting(wanted: object = 128, previous: object = 10, echoes: int = 0) -> Confirmation:
    return Confirmation("brightness", wanted, published_at=100.0, timeout_s=5.0, previous=previous, echoes=echoes)


def test_a_new_state_showing_the_value_confirms() -> None:
    wait = waiting()
    assert wait.on_state(128, retained=False, arrived_at=101.0) == Confirmed(128)
    assert wait.on_timeout() == Confirmed(128)  # settled: the deadline changes nothing


def test_a_retained_state_confirms_nothing() -> None:
    wait = waiting()
    assert wait.on_state(128, retained=True, arrived_at=101.0) is None
    assert isinstance(wait.on_timeout(), NotConfirmed)


def test_a_state_that_arrived_before_the_publish_confirms_nothing() -> None:
    wait = waiting()
    assert wait.on_state(128, retained=False, arrived_at=99.9) is None
    assert wait.on_state(128, retained=False, arrived_at=105.1) is None  # after the deadline
    assert isinstance(wait.on_timeout(), NotConfirmed)


def test_another_value_is_no_answer_yet() -> None:
    wait = waiting()
    assert wait.on_state(64, retained=False, arrived_at=101.0) is None
    assert wait.on_state(128.0, retained=False, arrived_at=102.0) == Confirmed(128)


def test_bool_and_number_are_not_mixed() -> None:
    wait = Confirmation("power", True, published_at=0.0, timeout_s=5.0, previous=False)
    assert wait.on_state(1, retained=False, arrived_at=1.0) is None
    assert wait.on_state(True, retained=False, arrived_at=1.0) == Confirmed(True)


def test_no_confirmation_fails_saying_it_was_published_once() -> None:
    outcome = waiting().on_timeout()
    assert outcome == NotConfirmed(
        "the device did not confirm brightness=128 within 5 s; the command was published once and not retried")


def test_an_optimistic_echo_is_skipped_and_the_report_after_it_confirms() -> None:
    wait = waiting(echoes=1)
    assert wait.on_state(128, retained=False, arrived_at=100.1) is None  # zigbee2mqtt's echo
    assert wait.on_state(128, retained=False, arrived_at=100.4) == Confirmed(128)  # the device's report


def test_an_echo_alone_confirms_nothing() -> None:
    wait = waiting(echoes=1)
    wait.on_state(128, retained=False, arrived_at=100.1)
    assert isinstance(wait.on_timeout(), NotConfirmed)


def test_the_value_it_already_had_ends_ok_without_an_echo_and_says_so() -> None:
    outcome = waiting(wanted="locked", previous="locked").on_timeout()
    assert isinstance(outcome, Confirmed)
    assert outcome.note == ('the device reported brightness="locked" already and published no new state within 5 s '
                            "(devices often do not echo an unchanged value); the command was published once")


def test_an_unknown_previous_state_is_not_the_value() -> None:
    assert isinstance(waiting(previous=UNKNOWN).on_timeout(), NotConfirmed)


# ---- commands.py: `iot/<id>/cmd` answered as firmware answers it --------------------------------------------

def _contract() -> Contract:
    return Contract.model_validate({
        "device_id": "ha-lamp-1", "name": "Lamp", "model": "lamp", "fw": "1.0.0",
        "actuators": [{"id": "lamp_brightness", "name": "Brightness", "type": "number", "action": "set_value",
                       "range": {"min": 0, "max": 255}, "step": 1, "risk": "low", "level": "write"}]})


def _cmd(command_id: str, value: object, **extra: object) -> bytes:
    return json.dumps({"id": command_id, "cmd": "set_value",
                       "params": {"actuator": "lamp_brightness", "value": value}, **extra}).encode()


def test_a_valid_command_executes_once_and_a_repeat_gets_the_stored_ack() -> None:
    commands = Commands()
    first = commands.receive(_cmd("c-1", 128), _contract(), {"lamp_brightness": 10})
    assert isinstance(first, Execute) and first.value == 128
    assert commands.receive(_cmd("c-1", 128), _contract(), {}) is None  # running: its ack will come
    ack = commands.finish("c-1", True, None, {"lamp_brightness": 128})
    again = commands.receive(_cmd("c-1", 128), _contract(), {})
    assert isinstance(again, Answer) and again.ack == ack == {"id": "c-1", "ok": True, "error": None,
                                                              "state": {"lamp_brightness": 128}}


def test_a_value_outside_the_contract_is_refused_with_the_contracts_words() -> None:
    answer = Commands().receive(_cmd("c-2", 999), _contract(), {"lamp_brightness": 10})
    assert isinstance(answer, Answer)
    assert answer.ack == {"id": "c-2", "ok": False, "state": {"lamp_brightness": 10},
                          "error": "lamp_brightness (set_value) takes a number from 0 to 255 in steps of 1; got 999"}


def test_malformed_and_stale_commands_execute_nothing() -> None:
    commands = Commands()
    bad = commands.receive(b"{", _contract(), {})
    assert isinstance(bad, Answer) and bad.ack["id"] is None and "not JSON" in str(bad.ack["error"])
    assert isinstance(commands.receive(_cmd("c-3", 1, epoch=20), _contract(), {}), Execute)
    stale = commands.receive(_cmd("c-4", 2, epoch=10), _contract(), {})
    assert isinstance(stale, Answer) and stale.ack["stale_epoch"] == {"sent": 10, "seen": 20}
    unknown = commands.receive(json.dumps({"id": "c-5", "cmd": "set_value", "params": {"actuator": "fan"}}).encode(),
                               _contract(), {})
    assert isinstance(unknown, Answer) and unknown.ack["error"] == 'unknown actuator "fan"; actuators: lamp_brightness'


def test_a_value_the_device_did_not_confirm_is_not_published_again_until_it_reports() -> None:
    commands = Commands()
    assert isinstance(commands.receive(_cmd("c-6", 40), _contract(), {}), Execute)
    commands.finish("c-6", False, "the device did not confirm lamp_brightness=40 within 5 s", {})
    commands.not_confirmed("lamp_brightness", 40, "the device did not confirm lamp_brightness=40 within 5 s")
    again = commands.receive(_cmd("c-7", 40), _contract(), {})  # the controller driving the same target again
    assert isinstance(again, Answer) and again.ack["ok"] is False
    assert "not published again" in str(again.ack["error"])
    assert isinstance(commands.receive(_cmd("c-8", 41), _contract(), {}), Execute)  # another value is a new request
    commands.heard("lamp_brightness")
    assert isinstance(commands.receive(_cmd("c-9", 40), _contract(), {}), Execute)

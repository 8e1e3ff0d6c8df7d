"""The bridge's confirmation rule: only a new, non-retained state after the publish, within the timeout, confirms."""

from __future__ import annotations

from corral.bridge.confirm import UNKNOWN, Confirmation, Confirmed, NotConfirmed


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

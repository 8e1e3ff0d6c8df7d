"""The exit status of a command that asks for something tells a denial from a success without reading the message."""

from __future__ import annotations

import pytest

from corral.api.codes import DECISION_CODES, phase_of
from corral.cli import outcomes
from corral.cli.outcomes import exit_status


def test_only_an_executed_request_exits_zero() -> None:
    assert exit_status("EXECUTED") == 0
    assert [code for code in DECISION_CODES if exit_status(code) == 0] == ["EXECUTED", "DEDUP"]


@pytest.mark.parametrize("code", [c for c in DECISION_CODES if phase_of(c) == "Denied" and c != "DEDUP"])
def test_every_refusal_exits_with_the_refused_status(code: str) -> None:
    assert exit_status(code) == outcomes.REFUSED == 3


@pytest.mark.parametrize("code", ["FAILED", "TIMEOUT", "DEVICE_GONE"])
def test_allowed_but_not_done_has_a_status_of_its_own(code: str) -> None:
    assert exit_status(code) == outcomes.NOT_DONE == 4


@pytest.mark.parametrize("code", ["AWAITING_APPROVAL", "PENDING"])
def test_not_decided_yet_is_neither_success_nor_refusal(code: str) -> None:
    assert exit_status(code) == outcomes.UNDECIDED == 5


def test_the_statuses_do_not_collide_with_clicks_own() -> None:
    assert len({outcomes.DONE, outcomes.ERROR, outcomes.USAGE, outcomes.REFUSED, outcomes.NOT_DONE,
                outcomes.UNDECIDED}) == 6

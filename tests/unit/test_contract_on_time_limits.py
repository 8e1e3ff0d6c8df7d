"""On-time limits in contract changes: more time on (a limit raised or removed, a required hold dropped) waits
for a person like a wider range; less (a limit lowered or added, a hold now required) is accepted by itself."""

from __future__ import annotations

from typing import Any

import pytest

from corral.contract.diff import contract_diff, limit_widenings
from corral.contract.model import Actuator, Contract
from corral.contract.trust import judge, widenings
from corral_sim.catalog import contract_for


def heater(**power: Any) -> Contract:
    """The catalog space heater with its power actuator changed (a key set to None is removed)."""
    data = contract_for("space_heater")
    actuators = []
    for spec in data["actuators"]:
        if spec["id"] == "power":
            spec = {k: v for k, v in {**spec, **power}.items() if v is not None}
        actuators.append(spec)
    return Contract.model_validate({**data, "actuators": actuators, "device_id": "heater-1"})


def power(contract: Contract) -> Actuator:
    actuator = contract.actuator("power")
    assert actuator is not None
    return actuator


ACCEPTED = heater()  # max_on_seconds 7200, hold_required true


@pytest.mark.parametrize(("changed", "reason"), [
    (heater(max_on_seconds=14400), "max_on_seconds raised (7200 -> 14400 s: it may stay on longer)"),
    (heater(max_on_seconds=None, hold_required=None),
     "max_on_seconds removed (was 7200 s: nothing switches it off by itself any more)"),
    (heater(hold_required=None), "hold_required dropped (an Intent may switch it on without a hold)"),
    (heater(hold_required=False), "hold_required dropped (an Intent may switch it on without a hold)"),
])
def test_more_time_on_is_held_for_a_person(changed: Contract, reason: str) -> None:
    assert f"actuator power: {reason}" in widenings(ACCEPTED, changed)
    acceptance = judge(changed, "cap-new", ACCEPTED, "cap-old", None, check_versions=False)
    assert acceptance.accepted == "cap-old" and f"actuator power: {reason}" in acceptance.hold
    assert judge(changed, "cap-new", ACCEPTED, "cap-old", "cap-new", check_versions=False).hold == (), \
        "a person accepting that contract lets it through"


@pytest.mark.parametrize("changed", [
    heater(max_on_seconds=3600),  # lowered
    heater(max_on_seconds=7200.0),  # the same figure as a float
])
def test_less_time_on_is_accepted_by_itself(changed: Contract) -> None:
    assert widenings(ACCEPTED, changed) == []
    assert judge(changed, "cap-new", ACCEPTED, "cap-old", None, check_versions=False).hold == ()


def test_adding_a_limit_or_a_required_hold_is_narrowing() -> None:
    bare = heater(max_on_seconds=None, hold_required=None)
    assert widenings(bare, ACCEPTED) == []
    assert widenings(bare, heater(max_on_seconds=600, hold_required=None)) == []
    assert widenings(heater(hold_required=None), ACCEPTED) == []
    # The catalog relay gained its 4 h limit in issue 32: a device updated to it is accepted by itself.
    relay = Contract.model_validate({**contract_for("relay"), "device_id": "relay-1"})
    actuators = [{k: v for k, v in a.model_dump(exclude_none=True).items() if k != "max_on_seconds"}
                 for a in relay.actuators]
    unlimited = Contract.model_validate({**relay.model_dump(exclude_none=True), "actuators": actuators})
    assert widenings(unlimited, relay) == [] and widenings(relay, unlimited) != []


def test_limit_widenings_alone_and_the_diff_lines_people_read() -> None:
    assert limit_widenings(power(ACCEPTED), power(ACCEPTED)) == []
    assert limit_widenings(power(ACCEPTED), power(heater(max_on_seconds=7201))) == [
        "max_on_seconds raised (7200 -> 7201 s: it may stay on longer)"]
    lines = contract_diff(ACCEPTED, heater(max_on_seconds=14400, hold_required=None))
    assert "actuator power: max_on_seconds 7200.0 -> 14400.0" in lines
    assert "actuator power: hold_required True -> (none)" in lines

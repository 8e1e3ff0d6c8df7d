"""The bridged trust rule (contract.trust.first_bridged, with_risk) and a bridged Device's status words."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from corral.api.capability import capability_name
from corral.api.discovered import contract_hash
from corral.contract.model import Contract
from corral.contract.trust import BRIDGED_MISMATCH, judge, with_risk
from corral.gateway.tools.control import DeviceTool
from corral.gateway.visible import VisibleDevice
from corral.reconcile.devices.status import Observed, bridged_words, device_status


def contract(risk: str = "high", maximum: float = 100) -> Contract:
    return Contract.model_validate({
        "device_id": "z2m-bulb", "name": "Bulb", "model": "LED1545G12", "fw": "1.0.0",
        "actuators": [{"id": "light", "name": "Light", "type": "bool", "action": "set_state", "risk": risk,
                       "level": "write"},
                      {"id": "brightness", "name": "Brightness", "type": "number", "action": "set_value",
                       "range": {"min": 0, "max": maximum}, "risk": "low", "level": "write"}]})


def test_the_first_bridged_contract_binds_only_with_the_accepted_hash() -> None:
    accepted = contract()
    verdict = judge(accepted, capability_name(accepted), None, None, None, True, bridged_hash=contract_hash(accepted))
    assert verdict.accepted == capability_name(accepted) and not verdict.hold

    other = contract(maximum=254)
    held = judge(other, capability_name(other), None, None, None, True, bridged_hash=contract_hash(accepted))
    assert held.accepted is None and held.hold_reason == BRIDGED_MISMATCH
    assert "not the one a person accepted" in held.hold[0]


def test_a_person_can_accept_the_announced_bridged_contract_instead() -> None:
    other = contract(maximum=254)
    verdict = judge(other, capability_name(other), None, None, capability_name(other), True,
                    bridged_hash=contract_hash(contract()))
    assert verdict.accepted == capability_name(other) and not verdict.hold


def test_later_changes_are_judged_as_a_native_devices_are() -> None:
    first, wider = contract(), contract(maximum=254)
    verdict = judge(wider, capability_name(wider), first, capability_name(first), None, True,
                    bridged_hash=contract_hash(first))
    assert verdict.accepted == capability_name(first)
    assert any("range widened" in why for why in verdict.hold)


def test_a_native_device_binds_its_first_contract_as_before() -> None:
    first = contract()
    assert judge(first, capability_name(first), None, None, None, True).accepted == capability_name(first)


def test_risk_overrides_change_the_hash_and_a_lowered_risk_is_a_widening() -> None:
    base = contract()
    lowered = with_risk(base, {"light": "low", "gone": "critical"})
    assert [a.risk for a in lowered.actuators] == ["low", "low"] and contract_hash(lowered) != contract_hash(base)
    assert with_risk(base, None) is base
    verdict = judge(lowered, capability_name(lowered), base, capability_name(base), None, True)
    assert any("risk lowered" in why for why in verdict.hold)


def observed(**changes: Any) -> Observed:
    base = Observed(generation=1, online=True, capability="bulb-1", contract_error=None, reported={}, sensors={},
                    command_epoch=0, verdict=None, device="bulb")
    return replace(base, **changes)


def test_a_bridged_device_says_so_and_a_first_mismatch_trusts_nothing() -> None:
    now = datetime.now(UTC)
    status = device_status(observed(accepted_capability="bulb-1", bridged=bridged_words("z2m")), None, now)
    bridged = next(c for c in status.conditions if c.type == "Bridged")
    assert (bridged.status, bridged.reason) == ("True", "Accepted")
    assert bridged.message == ("bridged from z2m; a person's acceptance stands in for the firmware signature; "
                               "no device-side clamp: the bridge validates and clamps")

    held = device_status(observed(hold=("the bridged contract is not the one a person accepted",),
                                  hold_reason=BRIDGED_MISMATCH, bridged=bridged_words("z2m")), None, now)
    assert held.accepted_capability is None  # a restart must not trust what was held
    accepted = next(c for c in held.conditions if c.type == "ContractAccepted")
    assert (accepted.status, accepted.reason) == ("False", BRIDGED_MISMATCH)
    assert "corral devices accept-contract bulb" in accepted.message


def visible(bridge: dict[str, Any] | None) -> VisibleDevice:
    spec: dict[str, Any] = {"deviceId": "z2m-bulb", **({"bridge": bridge} if bridge else {})}
    body = {"spec": spec, "status": {"online": True}}
    return VisibleDevice("home", "bulb", body, contract(), frozenset({"read", "write"}))


def test_agents_are_told_a_bridged_device_has_no_device_side_clamp_and_its_source() -> None:
    bulb = visible({"source": "z2m", "discovered": "z2m-bulb", "acceptedContractHash": "0" * 64})
    assert bulb.summary()["bridged_from"] == "z2m"
    detail = bulb.detail(datetime.now(UTC))
    assert detail["bridge"]["source"] == "z2m" and "no device-side clamp" in detail["bridge"]["note"]
    light = next(a for a in bulb.usable_actuators() if a.id == "light")
    tool = DeviceTool("bulb.light.set_state", bulb, light)
    assert "Bridged from source z2m: no device-side clamp" in tool.description
    native = visible(None)
    assert "bridged_from" not in native.summary() and "bridge" not in native.detail(datetime.now(UTC))
    assert "Bridged" not in DeviceTool("bulb.light.set_state", native, light).description

"""Risk for bridged actuators: discovery data says nothing about harm, so it comes from this documented table.

The table goes by component, the capability within it (a light's brightness, a climate's target temperature) and
the Home Assistant device class; docs/bridge.md ("Risk") shows it with the same reasons. A person overrides it per
Device (`spec.bridge.risk: {actuator_id: risk}`, applied by mapping.derive); a lowered risk is a widening of the
contract and is held like any other (contract/trust.py). Pure.

Device text can only raise a risk here, never lower it: a switch whose name says "heater" becomes high, but no name
makes a lock low.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from corral.contract.model import Risk

_RANK: dict[str, int] = {"low": 0, "medium": 1, "high": 2, "critical": 3}
_RISKS: dict[str, Risk] = {"low": "low", "medium": "medium", "high": "high", "critical": "critical"}

# Loads that heat or burn: a name or object id that says so makes a switch or outlet high (raising only).
# A word starts after a non-letter (object ids join words with "_"), so "environment" is not an iron.
_HEAT_WORDS = re.compile(r"(?<![a-z])(heat|boiler|oven|stove|kettle|iron|radiator|sauna|furnace|geyser)",
                         re.IGNORECASE)

HIGH_COVER_CLASSES = frozenset({"garage", "gate", "door"})
LOW_COVER_CLASSES = frozenset({"blind", "shade", "curtain"})


@dataclass(frozen=True)
class RiskRule:
    """A risk and the reason a person reads for it (also shown in docs/bridge.md)."""

    risk: Risk
    why: str


def higher(a: Risk, b: Risk) -> Risk:
    return a if _RANK[a] >= _RANK[b] else b


def lower_than(a: str, b: str) -> bool:
    """Whether risk a is below risk b (an override that lowers is a widening)."""
    return _RANK.get(a, 0) < _RANK.get(b, 0)


def risk_for(component: str, capability: str, config: Mapping[str, Any], object_id: str = "") -> RiskRule:
    """The documented risk of one actuator: `component` (switch, light, ...), `capability` (state, brightness,
    color_temp, preset_mode, percentage, position, target_temperature, mode, value, option)."""
    device_class = str(config.get("device_class") or "").lower()
    rule = _table(component, capability, device_class)
    if component in ("switch", "number", "select", "fan") and rule.risk != "high":
        said = " ".join(str(x) for x in (object_id, config.get("name") or "") if x)
        if _HEAT_WORDS.search(said):
            return RiskRule("high", "its name says it heats (heater, boiler, oven, ...): a heat source left on "
                            "can burn or start a fire")
    return rule


def _table(component: str, capability: str, device_class: str) -> RiskRule:
    if component == "lock":
        return RiskRule("high", "a lock guards a door: unlocking it lets anyone in")
    if component == "valve":
        return RiskRule("high", "a valve lets water or gas flow: open at the wrong time it floods or leaks")
    if component == "climate":
        return RiskRule("high", "a heater or air conditioner: a wrong temperature harms people, pets or the house "
                        "and costs energy")
    if component == "cover":
        if device_class in HIGH_COVER_CLASSES:
            return RiskRule("high", f"a {device_class} opens the house to the outside and can trap or hit someone "
                            "as it moves")
        if device_class in LOW_COVER_CLASSES:
            return RiskRule("low", f"a {device_class} only changes light and view")
        return RiskRule("medium", "a motorised cover of unknown kind (shutter, awning, window, damper or "
                        "unclassified) moves with force and may open the house")
    if component == "switch":
        if device_class == "outlet":
            return RiskRule("high", "an outlet powers whatever is plugged in, which may be a heater or an iron")
        return RiskRule("medium", "a switch whose load is not known: it may power anything")
    if component == "light":
        return RiskRule("low", "a light: a wrong value is a nuisance, not a harm")
    if component == "fan":
        return RiskRule("low", "a fan moves air: a wrong value is a nuisance, not a harm")
    if component == "number":
        return RiskRule("medium", "a number sets some parameter of the device whose effect is not known")
    if component == "select":
        return RiskRule("medium", "an option sets some mode of the device whose effect is not known")
    return RiskRule("high", "a component the table does not know: assumed harmful")


def apply_overrides(risks: Mapping[str, RiskRule], overrides: Mapping[str, str]) -> tuple[dict[str, RiskRule],
                                                                                        tuple[str, ...]]:
    """Each actuator's risk with a person's overrides applied; and the override keys that name no actuator (or
    name no risk), for the caller to report."""
    out = dict(risks)
    unknown: list[str] = []
    for actuator_id, risk in sorted(overrides.items()):
        known = _RISKS.get(risk)
        if actuator_id not in out or known is None:
            unknown.append(actuator_id)
            continue
        was = out[actuator_id]
        out[actuator_id] = RiskRule(known, f"set by a person on the Device (the table says {was.risk}: {was.why})")
    return out, tuple(unknown)

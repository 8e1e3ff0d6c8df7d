"""What changed between two contracts of one device, in lines a person can read in an Event. Pure.

`contract_diff` tells every change; `wording_changes` only those of the words people and agents read and of
what the device reports (names, descriptions, units, the sensor and event lists), which `contract.trust`
holds for a person like any widening; `limit_widenings` the on-time limit changes that give an actuator more
time on (a raised or removed `max_on_seconds`, a dropped `hold_required`), held the same way, while a lowered or
added limit and an added `hold_required` are narrowing. Device text in these lines is quoted and cut: it is data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pydantic import BaseModel

from corral.contract.model import Actuator, Contract

_IGNORED = {"device_id", "signature"}
# How much of a changed text a hold reason quotes: enough to recognise it; the whole is in the diff's Event.
QUOTE_LIMIT = 48


def contract_diff(old: Contract, new: Contract) -> list[str]:
    lines = []
    for field in ("name", "model", "fw", "version"):
        before, after = getattr(old, field), getattr(new, field)
        if before != after:
            lines.append(f"{field}: {before} -> {after}")
    lines += _diff_items("actuator", {a.id: a for a in old.actuators}, {a.id: a for a in new.actuators})
    lines += _diff_items("sensor", {s.metric: s for s in old.sensors}, {s.metric: s for s in new.sensors})
    lines += _diff_items("event", {e.name: e for e in old.events}, {e.name: e for e in new.events})
    return lines


def wording_changes(old: Contract, new: Contract) -> list[str]:
    """Changed words and reported lists: the product name, each kept actuator's name and description, and any
    change of the sensors (added, removed, unit, range, description) and events (added, removed, values,
    description). Empty when the contracts say the same in these respects."""
    lines = [f"name changed to {quoted(new.name)}"] if new.name != old.name else []
    before = {a.id: a for a in old.actuators}
    for actuator in new.actuators:
        kept = before.get(actuator.id)
        for field in ("name", "description"):
            if kept is not None and getattr(kept, field) != getattr(actuator, field):
                lines.append(f"actuator {actuator.id}: {field} changed to {quoted(getattr(actuator, field))}")
    # A sensor's interval is judged by how it moves the freshness limit (contract.trust), not as wording.
    lines += _list_changes("sensor", {s.metric: s for s in old.sensors}, {s.metric: s for s in new.sensors},
                           ignore=frozenset({"interval_s"}))
    lines += _list_changes("event", {e.name: e for e in old.events}, {e.name: e for e in new.events})
    return lines


def limit_widenings(before: Actuator, after: Actuator) -> list[str]:
    """Where `after` lets the actuator stay on longer, or be switched on without a hold, than `before` did."""
    lines = []
    old, new = before.max_on_seconds, after.max_on_seconds
    if old is not None and new is None:
        lines.append(f"max_on_seconds removed (was {old:g} s: nothing switches it off by itself any more)")
    elif old is not None and new is not None and new > old:
        lines.append(f"max_on_seconds raised ({old:g} -> {new:g} s: it may stay on longer)")
    if before.hold_required and not after.hold_required:
        lines.append("hold_required dropped (an Intent may switch it on without a hold)")
    return lines


def _list_changes(what: str, old: Mapping[str, BaseModel], new: Mapping[str, BaseModel],
                  ignore: frozenset[str] = frozenset()) -> list[str]:
    lines = [f"{what} {key} removed" for key in sorted(old.keys() - new.keys())]
    lines += [f"{what} {key} added" for key in sorted(new.keys() - old.keys())]
    for key in sorted(old.keys() & new.keys()):
        before, after = old[key].model_dump(exclude_none=True), new[key].model_dump(exclude_none=True)
        for field in sorted((before.keys() | after.keys()) - ignore):
            if before.get(field) != after.get(field):
                value = after.get(field)
                lines.append(f"{what} {key}: {field} changed" + (f" to {quoted(value)}" if isinstance(value, str) else ""))
    return lines


def quoted(text: str) -> str:
    """Device text in a line for people: quoted (it is data, not the line's own words) and cut to one short line."""
    cut = text if len(text) <= QUOTE_LIMIT else text[:QUOTE_LIMIT - 1] + "…"
    return json.dumps(cut, ensure_ascii=False)


def _diff_items(what: str, old: dict[str, BaseModel], new: dict[str, BaseModel]) -> list[str]:
    lines = []
    for key in sorted(old.keys() - new.keys()):
        lines.append(f"{what} {key} removed")
    for key in sorted(new.keys() - old.keys()):
        lines.append(f"{what} {key} added: {_summary(new[key])}")
    for key in sorted(old.keys() & new.keys()):
        before = old[key].model_dump(mode="json", exclude_none=True)
        after = new[key].model_dump(mode="json", exclude_none=True)
        for field in sorted(before.keys() | after.keys()):
            if field not in _IGNORED and before.get(field) != after.get(field):
                lines.append(f"{what} {key}: {field} {_show(before.get(field))} -> {_show(after.get(field))}")
    return lines


def _summary(item: BaseModel) -> str:
    data = item.model_dump(mode="json", exclude_none=True, exclude={"description", "name"})
    return ", ".join(f"{k}={_show(v)}" for k, v in data.items() if v not in ("", [], {}))


def _show(value: object) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in value.items()) + "}"
    return str(value)

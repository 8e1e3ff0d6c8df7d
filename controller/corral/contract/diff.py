"""What changed between two contracts of one device, in lines a person can read in an Event."""

from __future__ import annotations

from pydantic import BaseModel

from corral.contract.model import Contract

_IGNORED = {"device_id", "signature"}


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

"""Conditions as Kubernetes API conventions describe them: a transition time that moves only on change."""

from __future__ import annotations

from typing import Any, Literal

Status = Literal["True", "False", "Unknown"]


def condition(type_: str, status: Status, reason: str, message: str, generation: int | None) -> dict[str, Any]:
    cond: dict[str, Any] = {"type": type_, "status": status, "reason": reason, "message": message[:1000]}
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def merge(previous: list[dict[str, Any]], wanted: list[dict[str, Any]], now: str) -> list[dict[str, Any]]:
    """Wanted conditions, keeping each one's lastTransitionTime when its status did not change."""
    before = {c.get("type"): c for c in previous}
    merged = []
    for cond in wanted:
        old = before.get(cond["type"])
        since = old.get("lastTransitionTime") if old and old.get("status") == cond["status"] else None
        merged.append({**cond, "lastTransitionTime": since or now})
    return merged

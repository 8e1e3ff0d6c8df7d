"""Conditions as Kubernetes API conventions describe them: a transition time that moves only on change."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from corral.api.base import Condition

Status = Literal["True", "False", "Unknown"]
MESSAGE_LIMIT = 1000


@dataclass(frozen=True)
class Wanted:
    """A condition as the controller sees it now, before its transition time is known."""

    type: str
    status: Status
    reason: str
    message: str
    generation: int | None


def merge(previous: Sequence[Condition], wanted: Sequence[Wanted], now: datetime) -> list[Condition]:
    """Wanted conditions, keeping each one's lastTransitionTime when its status did not change."""
    before = {c.type: c for c in previous}
    merged = []
    for cond in wanted:
        old = before.get(cond.type)
        since = old.last_transition_time if old is not None and old.status == cond.status else now
        merged.append(Condition(type=cond.type, status=cond.status, reason=cond.reason,
                                message=cond.message[:MESSAGE_LIMIT], last_transition_time=since,
                                observed_generation=cond.generation))
    return merged

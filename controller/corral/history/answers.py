"""Answers bounded for an agent: every history answer fits in a byte budget (32 KB by default).

An agent reads an answer into its context; an unbounded one overruns its token budget (ha-mcp's 48-hour query
returned 59 KB before it was downsampled). When an answer's JSON is over the budget, points are dropped evenly
from every series (the first and last kept, the rest at even strides), and the answer says so: `thinned: true`
and how many points were dropped, so the agent knows it sees a sample of the range, not all of it.
"""

from __future__ import annotations

import json
from typing import Any, Final

MAX_ANSWER_BYTES: Final = 32 * 1024


def answer_bytes(answer: dict[str, Any]) -> int:
    """The size of the answer as compact JSON, the way it goes over the wire."""
    return len(json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode())


def evenly(items: list[Any], keep: int) -> list[Any]:
    """`keep` of the items at even strides, the first and the last among them."""
    if keep >= len(items):
        return items
    if keep <= 0:
        return []
    if keep == 1:
        return [items[-1]]
    return [items[round(i * (len(items) - 1) / (keep - 1))] for i in range(keep)]


def bound_answer(answer: dict[str, Any], max_bytes: int = MAX_ANSWER_BYTES) -> dict[str, Any]:
    """The answer, with points dropped evenly from its series until its JSON is at most max_bytes."""
    size = answer_bytes(answer)
    if size <= max_bytes:
        return answer
    series: list[dict[str, Any]] = answer.get("series", [])
    original = sum(len(s["points"]) for s in series)
    fraction = 1.0
    while size > max_bytes:
        points = sum(len(s["points"]) for s in series)
        if points == 0:
            break  # nothing left to drop: the series' own descriptions are over the budget (too many keys asked)
        empty = answer_bytes({**answer, "series": [{**s, "points": []} for s in series]})
        fraction = min(fraction * 0.9, max(0.0, (max_bytes - empty) / max(1, size - empty)) * 0.95)
        for item in series:
            item["points"] = evenly(item["points"], int(len(item["points"]) * fraction)) if fraction < 1 else item["points"]
        answer["thinned"] = True
        answer["dropped_points"] = original - sum(len(s["points"]) for s in series)
        size = answer_bytes(answer)
    return answer

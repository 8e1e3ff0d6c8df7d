"""Durations as Kubernetes objects write them (`holdFor: 20m`, `for: 2s`): Go's time.ParseDuration syntax,
limited to whole or decimal numbers of ms, s, m and h, so a person reads what a controller waits for."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Final

from pydantic import AfterValidator, Field

DURATION_PATTERN: Final = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_SECONDS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds_of(text: str) -> float:
    """`1m30s` -> 90.0. Raises ValueError naming the accepted forms for anything else."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"{text!r} is not a duration: write a number with a unit, ms, s, m or h (e.g. 3s, 20m, 1h30m)")
    return sum(float(number) * _SECONDS[unit] for number, unit in _PART.findall(text))


def to_timedelta(text: str) -> timedelta:
    return timedelta(seconds=seconds_of(text))


def written(seconds: float) -> str:
    """The shortest duration text for a number of seconds: 90 -> '90s', 0.5 -> '500ms'."""
    if seconds < 1 and seconds * 1000 == int(seconds * 1000):
        return f"{int(seconds * 1000)}ms"
    return f"{seconds:g}s"


def _checked(text: str) -> str:
    seconds_of(text)
    return text


Duration = Annotated[
    str,
    Field(pattern=DURATION_PATTERN, max_length=32,
          description="A duration: a number with a unit, ms, s, m or h (e.g. 3s, 20m, 1h30m)."),
    AfterValidator(_checked),
]

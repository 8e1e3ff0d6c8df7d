"""The history store's vocabulary: which series a sample belongs to, the sample itself, how a value is kept.

A value is what a device sends (`corral.devices.messages.StateValue`: bool | int | float | str). It is redeclared
here rather than imported so the history package stands alone: it imports nothing of MQTT, kopf or MCP, and the
store can be opened by a CLI, a bench or a test without the controller's modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Final, NamedTuple

Value = bool | int | float | str

MINUTE_MS: Final = 60_000
HOUR_MS: Final = 60 * MINUTE_MS
DAY_MS: Final = 24 * HOUR_MS
FIVE_MINUTES_MS: Final = 5 * MINUTE_MS


class Kind(IntEnum):
    """How a value is stored in the `kind` column. NUMBER and BOOL are 0 and 1 on purpose: SQLite's record
    format stores the integers 0 and 1 in no payload bytes at all, so the flag costs one header byte a row."""

    NUMBER = 0  # int kept as INTEGER (21 comes back as 21, not 21.0), float as REAL
    BOOL = 1  # kept as 0/1, so mean is the fraction of time (or of samples) it was true
    TEXT = 2  # an enum state: only last and count are kept for it


def encode(value: Value) -> tuple[Kind, int | float | str]:
    """The (kind, stored value) of a sample's value; bool is tested first since bool is an int in Python."""
    if isinstance(value, bool):
        return Kind.BOOL, int(value)
    if isinstance(value, int):
        # SQLite integers are 64-bit: a bigger one (JSON allows it) is kept as REAL rather than failing the batch.
        return Kind.NUMBER, value if -(2**63) <= value < 2**63 else float(value)
    if isinstance(value, float):
        return Kind.NUMBER, value
    return Kind.TEXT, str(value)


def decode(kind: int, stored: int | float | str | None) -> Value | None:
    """The value as the device sent it, from what encode() stored."""
    if stored is None:
        return None
    if kind == Kind.BOOL:
        return bool(stored)
    return stored


class SeriesKey(NamedTuple):
    """A series: one metric of one Device. The store maps it to a small integer id (the `series` table)."""

    namespace: str
    device: str
    metric: str


class HistorySample(NamedTuple):
    """One sample to keep: `ts_ms` by the device's clock (what an agent cites), `received_ms` by the controller's
    (what freshness is measured with), as `corral.devices.telemetry.Reading` holds them."""

    key: SeriesKey
    ts_ms: int
    received_ms: int
    value: Value


@dataclass(frozen=True)
class SeriesInfo:
    """What the store knows of a series besides its samples: the unit, and whether the sensor reports on change
    (a step: each value holds until the next) or periodically (each sample stands for itself)."""

    id: int
    key: SeriesKey
    unit: str | None
    step: bool


@dataclass(frozen=True)
class Retention:
    """How long each resolution is kept, and the size bound. Defaults are issue 42's: raw 10 days
    (`--history-raw-days`, as Home Assistant's `purge_keep_days`), 5-minute rollups 90 days, hourly 2 years.

    `max_hold_ms`: how long an on-change (step) value is carried forward without a new sample. A bridged sensor
    that reports only changes still checks in now and then; past a day of silence the store says "unknown" (a gap)
    rather than pretend the last value still holds.
    """

    raw_days: float = 10
    five_minute_days: float = 90
    hourly_days: float = 730
    max_bytes: int | None = None
    max_hold_ms: int = DAY_MS

    def cutoffs(self, now_ms: int) -> dict[str, int]:
        """The oldest time each table keeps, by table name."""
        return {"raw": now_ms - int(self.raw_days * DAY_MS),
                "rollup_5m": now_ms - int(self.five_minute_days * DAY_MS),
                "rollup_1h": now_ms - int(self.hourly_days * DAY_MS)}

"""Buckets of a series over time, in pure Python: step semantics, carry-forward and re-aggregation.

Periodic series are folded into their buckets by SQL triggers (schema.py); this module holds what SQL expresses
badly. For an on-change (step) sensor a value holds from its sample until the next sample, or for at most
`max_hold_ms` (Retention.max_hold_ms), whichever comes first; past that the value is unknown. Its bucket is then:
- weight: the milliseconds of the bucket a numeric value was held; sum: the integral of the value over them, so
  mean = sum / weight is time-weighted, and coarser buckets add up exactly;
- min / max over every value held for some of the bucket (the one carried in from before included);
- last: the value held at the bucket's end (or when the hold ran out), last_ts its sample's device time;
- count: the samples that fell in the bucket (0 for a bucket that only carries a value forward).
A bucket with samples is stored assuming its last value holds to the bucket's end (or the max hold): that is
what it will be unless another sample arrives, and one that does recomputes it. Buckets with no sample are not
stored; `carry_forward` fills them at query time from the bucket before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from corral.history.model import Kind, Value, decode


@dataclass(frozen=True)
class Bucket:
    """One bucket's statistics, as stored in rollup_5m / rollup_1h or computed from raw."""

    start: int
    count: int
    weight: float
    sum: float
    min: float | None
    max: float | None
    last: int | float | str | None  # as stored; decode() with last_kind gives the value
    last_kind: int
    last_ts: int

    @property
    def mean(self) -> float | None:
        return self.sum / self.weight if self.weight else None

    def value(self) -> Value | None:
        return decode(self.last_kind, self.last)


# A raw sample as the store reads it back: (device ts, kind, stored value).
Point = tuple[int, int, int | float | str]


def step_bucket(start: int, width: int, points: Sequence[Point], carried: Point | None,
                max_hold_ms: int) -> Bucket | None:
    """The bucket [start, start + width) of a step series, from the samples in it (oldest first) and the last
    sample before it (`carried`). None when nothing is held in the bucket at all."""
    end = start + width
    held: list[tuple[Point, int, int]] = []  # (sample, from, until) clipped to the bucket
    chain: list[Point] = ([carried] if carried is not None else []) + list(points)
    for i, point in enumerate(chain):
        until = min(point[0] + max_hold_ms, end)
        if i + 1 < len(chain):
            until = min(until, chain[i + 1][0])
        since = max(point[0], start)
        if until > since or (point[0] >= start and point is not carried):
            held.append((point, since, max(until, since)))
    if not held:
        return None
    weight, total, low, high = 0.0, 0.0, None, None
    for (_, kind, stored), since, until in held:
        if kind == Kind.TEXT or isinstance(stored, str):
            continue
        span = until - since
        weight, total = weight + span, total + float(stored) * span
        low = float(stored) if low is None else min(low, float(stored))
        high = float(stored) if high is None else max(high, float(stored))
    last = held[-1][0]
    return Bucket(start, len(points), weight, total, low, high, last[2], last[1], last[0])


def carry_forward(rows: Sequence[Bucket], before: Bucket | None, start: int, end: int, width: int,
                  max_hold_ms: int) -> list[Bucket]:
    """The buckets of a step series from start to end, the stored ones with the ones between them filled by the
    value held from the bucket before (within the max hold): min = max = last = the held value, count 0."""
    by_start = {row.start: row for row in rows}
    out: list[Bucket] = []
    previous = before
    first = start - start % width
    for bucket in range(first, end, width):
        row = by_start.get(bucket)
        if row is None and previous is not None:
            row = _carried(previous, bucket, width, max_hold_ms)
        if row is not None:
            out.append(row)
            previous = row
    return out


def _carried(previous: Bucket, bucket: int, width: int, max_hold_ms: int) -> Bucket | None:
    until = min(previous.last_ts + max_hold_ms, bucket + width)
    if until <= bucket:
        return None
    if previous.last_kind == Kind.TEXT or isinstance(previous.last, str) or previous.last is None:
        return replace(previous, start=bucket, count=0, weight=0.0, sum=0.0, min=None, max=None)
    value = float(previous.last)
    span = until - bucket
    return replace(previous, start=bucket, count=0, weight=float(span), sum=value * span, min=value, max=value)


def combine(start: int, buckets: Iterable[Bucket]) -> Bucket | None:
    """Several buckets as one (hours into a day, 5-minute buckets into a downsampled step): exact, since weight
    and sum add up. None for no buckets."""
    items = list(buckets)
    if not items:
        return None
    lows = [b.min for b in items if b.min is not None]
    highs = [b.max for b in items if b.max is not None]
    last = max(items, key=lambda b: (b.start, b.last_ts))
    return Bucket(start, sum(b.count for b in items), sum(b.weight for b in items), sum(b.sum for b in items),
                  min(lows) if lows else None, max(highs) if highs else None, last.last, last.last_kind, last.last_ts)


def periodic_bucket(start: int, points: Sequence[Point]) -> Bucket | None:
    """The bucket of a periodic series from its raw samples (oldest first): what the triggers keep, computed
    directly (used to downsample raw answers, and as the reference the tests hold the triggers to)."""
    if not points:
        return None
    numbers = [float(stored) for _, kind, stored in points if kind != Kind.TEXT and not isinstance(stored, str)]
    last = points[-1]
    return Bucket(start, len(points), float(len(numbers)), sum(numbers), min(numbers, default=None),
                  max(numbers, default=None), last[2], last[1], last[0])

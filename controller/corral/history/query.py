"""Reading history back: a range of one or more series at a period, bounded for an agent.

Periods: "raw" (the samples as kept), "5m" and "hour" (the rollups), "day" (hourly rollups added up by UTC day:
exact, since a bucket's weight and sum add). Step series are read with their held values carried through
buckets that had no sample (buckets.carry_forward), so "was the door open at 3 am" has an answer. A held value
is carried at most Retention.max_hold_ms and never past the query's end: the store does not know "now", so a
caller asking up to the present passes end = now (times.parse_range does). Buckets and days are UTC.

Limits and offsets, the rule: at most `limit` points per series (default 100, at most 1,000).
- When the range holds more points than `limit` and `downsample` is on (the default), the answer covers the
  WHOLE range in at most `limit` evenly spaced intervals of `step_ms` (a multiple of the period's width), each
  the exact aggregate of what fell in it (mean, min, max, last, count): `downsampled: true`, `has_more: false`.
  An agent asking "the last 48 hours" gets the shape of 48 hours, not its first hour.
- With `downsample=False` the points are exact and paged: `offset`, `has_more`, `next_offset`. (`offset` pages
  exact points only: a downsampled answer already covers the whole range.)
`downsampled`/`step_ms` are said per series and for the answer (true if any series was downsampled).
Then the answer is bounded in bytes (answers.bound_answer, 32 KB): points dropped evenly, `thinned: true`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Final, Literal, get_args

from corral.history.answers import MAX_ANSWER_BYTES, bound_answer
from corral.history.buckets import Bucket, Point, carry_forward, combine, periodic_bucket, step_bucket
from corral.history.model import DAY_MS, FIVE_MINUTES_MS, HOUR_MS, SeriesInfo, SeriesKey, decode

Period = Literal["raw", "5m", "hour", "day"]
Stat = Literal["mean", "min", "max", "last", "count"]
PERIODS: Final = get_args(Period)
STATS: Final[tuple[Stat, ...]] = get_args(Stat)
WIDTH_MS: Final = {"5m": FIVE_MINUTES_MS, "hour": HOUR_MS, "day": DAY_MS}
DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 1000


class QueryError(ValueError):
    """A query the store will not answer as asked; the message says what is allowed."""


def query(conn: sqlite3.Connection, keys: Sequence[SeriesKey], start_ms: int, end_ms: int, *,
          period: str = "5m", stats: Sequence[str] = STATS, limit: int = DEFAULT_LIMIT, offset: int = 0,
          downsample: bool = True, max_hold_ms: int = DAY_MS, max_bytes: int = MAX_ANSWER_BYTES) -> dict[str, Any]:
    """The answer as a JSON-ready dict (see the module docstring for its shape and rules)."""
    chosen = _check(period, stats, limit, offset, start_ms, end_ms)
    answer: dict[str, Any] = {"period": period, "start_ms": start_ms, "end_ms": end_ms, "stats": list(chosen),
                              "limit": limit, "offset": offset, "downsampled": False, "step_ms": None,
                              "has_more": False, "next_offset": None, "series": []}
    for key in keys:
        info = _series(conn, key)
        entry: dict[str, Any] = {"namespace": key.namespace, "device": key.device, "metric": key.metric,
                                 "unit": info.unit if info else None, "step": info.step if info else False,
                                 "found": info is not None, "points": []}
        answer["series"].append(entry)
        if info is None:
            continue
        if period == "raw":
            points, more, step = _raw(conn, info, start_ms, end_ms, chosen, limit, offset, downsample, max_hold_ms)
        else:
            buckets = _buckets(conn, info, period, start_ms, end_ms, max_hold_ms)
            points, more, step = _paged_or_downsampled(buckets, WIDTH_MS[period], start_ms, end_ms, chosen, limit,
                                                       offset, downsample)
        entry["points"], entry["downsampled"], entry["step_ms"] = points, step is not None, step
        if step is not None:
            answer["downsampled"], answer["step_ms"] = True, step
        if more:
            answer["has_more"], answer["next_offset"] = True, offset + limit
    return bound_answer(answer, max_bytes)


def _check(period: str, stats: Sequence[str], limit: int, offset: int, start_ms: int, end_ms: int) -> list[Stat]:
    if period not in PERIODS:
        raise QueryError(f"unknown period {period!r}: use one of {', '.join(PERIODS)}")
    unknown = [s for s in stats if s not in STATS]
    if unknown or not stats:
        raise QueryError(f"unknown statistics {unknown or stats!r}: choose from {', '.join(STATS)}")
    if not 1 <= limit <= MAX_LIMIT:
        raise QueryError(f"limit {limit} is out of range: 1 to {MAX_LIMIT} points per series")
    if offset < 0:
        raise QueryError(f"offset {offset} is negative")
    if end_ms <= start_ms:
        raise QueryError(f"the end ({end_ms}) must come after the start ({start_ms})")
    return [s for s in STATS if s in stats]


def _series(conn: sqlite3.Connection, key: SeriesKey) -> SeriesInfo | None:
    row = conn.execute("SELECT id, unit, step FROM series WHERE namespace = ? AND device = ? AND metric = ?",
                       tuple(key)).fetchone()
    return SeriesInfo(row[0], key, row[1], bool(row[2])) if row else None


def _raw(conn: sqlite3.Connection, info: SeriesInfo, start: int, end: int, stats: list[Stat], limit: int,
         offset: int, downsample: bool, max_hold_ms: int) -> tuple[list[dict[str, Any]], bool, int | None]:
    total = conn.execute("SELECT count(*) FROM raw WHERE series = ? AND ts >= ? AND ts < ?",
                         (info.id, start, end)).fetchone()[0]
    if total <= limit or not downsample:
        rows = conn.execute("SELECT ts, received, kind, value FROM raw WHERE series = ? AND ts >= ? AND ts < ? "
                            "ORDER BY ts LIMIT ? OFFSET ?", (info.id, start, end, limit, offset)).fetchall()
        points = [{"ts": ts, "received_ms": ts + received, "value": decode(kind, value)}
                  for ts, received, kind, value in rows]
        return points, offset + len(points) < total, None
    step = -(-(end - start) // limit)
    samples: list[Point] = [(ts, kind, value) for ts, kind, value in conn.execute(
        "SELECT ts, kind, value FROM raw WHERE series = ? AND ts >= ? AND ts < ? ORDER BY ts", (info.id, start, end))]
    carried = None
    if info.step:
        row = conn.execute("SELECT ts, kind, value FROM raw WHERE series = ? AND ts < ? ORDER BY ts DESC LIMIT 1",
                           (info.id, start)).fetchone()
        carried = (row[0], row[1], row[2]) if row else None
    out: list[dict[str, Any]] = []
    i = 0
    for lo in range(start, end, step):
        hi = min(lo + step, end)
        group: list[Point] = []
        while i < len(samples) and samples[i][0] < hi:
            group.append(samples[i])
            i += 1
        bucket = (step_bucket(lo, hi - lo, group, carried, max_hold_ms) if info.step
                  else periodic_bucket(lo, group))
        if group:
            carried = group[-1]
        if bucket is not None:
            out.append(_point(bucket, stats))
    return out, False, step


def _buckets(conn: sqlite3.Connection, info: SeriesInfo, period: str, start: int, end: int,
             max_hold_ms: int) -> list[Bucket]:
    """The stored buckets of the period (day: hourly ones) over the range, step series carried forward."""
    table, width = ("rollup_5m", FIVE_MINUTES_MS) if period == "5m" else ("rollup_1h", HOUR_MS)
    first = start - start % (DAY_MS if period == "day" else width)
    columns = "bucket, count, weight, sum, min, max, last, last_kind, last_ts"
    rows = [Bucket(*row) for row in conn.execute(
        f"SELECT {columns} FROM {table} WHERE series = ? AND bucket >= ? AND bucket < ? ORDER BY bucket",
        (info.id, first, end))]
    if info.step:
        before = conn.execute(f"SELECT {columns} FROM {table} WHERE series = ? AND bucket < ? ORDER BY bucket DESC "
                              "LIMIT 1", (info.id, first)).fetchone()
        rows = carry_forward(rows, Bucket(*before) if before else None, first, end, width, max_hold_ms)
    if period == "day":
        rows = _grouped(rows, first, DAY_MS)
    return rows


def _grouped(buckets: Sequence[Bucket], origin: int, width: int) -> list[Bucket]:
    """Buckets combined into intervals of `width` counted from origin (hours into days, or a downsampling step)."""
    groups: dict[int, list[Bucket]] = {}
    for bucket in buckets:
        groups.setdefault(origin + (bucket.start - origin) // width * width, []).append(bucket)
    return [b for start, members in sorted(groups.items()) if (b := combine(start, members)) is not None]


def _paged_or_downsampled(buckets: list[Bucket], width: int, start: int, end: int, stats: list[Stat], limit: int,
                          offset: int, downsample: bool) -> tuple[list[dict[str, Any]], bool, int | None]:
    if len(buckets) <= limit or not downsample:
        page = buckets[offset:offset + limit]
        return [_point(b, stats) for b in page], offset + len(page) < len(buckets), None
    origin = start - start % width
    spans = -(-(end - origin) // width)  # buckets the range spans
    step = -(-spans // limit) * width  # whole buckets per interval, so at most `limit` intervals
    return [_point(b, stats) for b in _grouped(buckets, origin, step)], False, step


def _point(bucket: Bucket, stats: list[Stat]) -> dict[str, Any]:
    point: dict[str, Any] = {"ts": bucket.start}
    for stat in stats:
        if stat == "mean":
            mean = bucket.mean  # derived, so 9 significant digits: 22.8333333, not 22.833333333333332 (answer bytes)
            point["mean"] = None if mean is None else float(f"{mean:.9g}")
        elif stat == "min":
            point["min"] = bucket.min
        elif stat == "max":
            point["max"] = bucket.max
        elif stat == "last":
            point["last"] = bucket.value()
            point["last_ts"] = bucket.last_ts
        else:
            point["count"] = bucket.count
    return point

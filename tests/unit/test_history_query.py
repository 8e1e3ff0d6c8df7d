"""Reading history back for an agent: limits, offsets, has_more, even downsampling over the whole range, answers
under 32 KB, days from hours, and times written as "24h", "7d" or ISO 8601 with errors that say what is allowed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from corral.history.answers import MAX_ANSWER_BYTES, answer_bytes, bound_answer
from corral.history.model import DAY_MS, FIVE_MINUTES_MS, HOUR_MS, MINUTE_MS, HistorySample, SeriesKey
from corral.history.query import QueryError
from corral.history.store import HistoryStore
from corral.history.times import TimeSyntaxError, parse_range, parse_time

T0 = 1_800_000_000_000 - 1_800_000_000_000 % DAY_MS
TEMP = SeriesKey("cold-store", "freezer-2", "temperature")
HUM = SeriesKey("cold-store", "freezer-2", "humidity")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[HistoryStore]:
    """Two days of a sample every 10 s on two metrics."""
    s = HistoryStore(tmp_path / "h.db")
    every = 10_000
    for lo in range(0, 2 * DAY_MS // every, 5000):
        s.append([HistorySample(key, T0 + i * every, T0 + i * every + 30, -18.0 + (i % 360) / 100 + (k * 50))
                  for i in range(lo, min(2 * DAY_MS // every, lo + 5000)) for k, key in enumerate((TEMP, HUM))])
    yield s
    s.close()


def points(answer: dict[str, Any], index: int = 0) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = answer["series"][index]["points"]
    return found


def test_exact_raw_points_page_with_offsets_and_has_more(store: HistoryStore) -> None:
    start, end = T0, T0 + 25 * 10_000
    first = store.query([TEMP], start, end, period="raw", limit=10, downsample=False)
    assert [p["ts"] for p in points(first)] == [T0 + i * 10_000 for i in range(10)]
    assert first["has_more"] is True and first["next_offset"] == 10 and first["downsampled"] is False
    assert points(first)[0]["received_ms"] == T0 + 30
    second = store.query([TEMP], start, end, period="raw", limit=10, offset=10, downsample=False)
    last = store.query([TEMP], start, end, period="raw", limit=10, offset=20, downsample=False)
    assert [p["ts"] for p in points(second)] == [T0 + i * 10_000 for i in range(10, 20)]
    assert len(points(last)) == 5 and last["has_more"] is False and last["next_offset"] is None


def test_rollups_page_too(store: HistoryStore) -> None:
    day = store.query([TEMP], T0, T0 + DAY_MS, period="5m", limit=100, offset=200, downsample=False)
    assert len(points(day)) == 88 and day["has_more"] is False
    assert points(day)[0]["ts"] == T0 + 200 * FIVE_MINUTES_MS and points(day)[0]["count"] == 30


def test_more_points_than_the_limit_are_downsampled_evenly_over_the_whole_range(store: HistoryStore) -> None:
    answer = store.query([TEMP], T0, T0 + DAY_MS, period="5m", limit=100)  # 288 buckets in a day
    got = points(answer)
    assert answer["downsampled"] is True and answer["has_more"] is False
    step = answer["step_ms"]
    assert step == 3 * FIVE_MINUTES_MS and len(got) == 96
    assert [p["ts"] for p in got] == [T0 + i * step for i in range(96)]  # evenly spaced, start to end
    assert sum(p["count"] for p in got) == DAY_MS // 10_000  # every sample counted once
    assert got[-1]["last_ts"] == T0 + DAY_MS - 10_000

    raw = store.query([TEMP], T0, T0 + HOUR_MS, period="raw", limit=7)  # 360 samples in 7 intervals
    assert raw["downsampled"] is True and len(points(raw)) == 7
    assert sum(p["count"] for p in points(raw)) == 360
    assert points(raw)[0]["ts"] == T0 and points(raw)[-1]["ts"] == T0 + 6 * raw["step_ms"]


def test_a_day_is_the_exact_sum_of_its_hours(store: HistoryStore) -> None:
    days = points(store.query([TEMP], T0, T0 + 2 * DAY_MS, period="day"))
    hours = points(store.query([TEMP], T0, T0 + DAY_MS, period="hour", limit=1000))
    assert [d["ts"] for d in days] == [T0, T0 + DAY_MS]
    assert days[0]["count"] == sum(h["count"] for h in hours) == 8640
    assert days[0]["mean"] == pytest.approx(sum(h["mean"] * h["count"] for h in hours) / 8640)
    assert days[0]["min"] == min(h["min"] for h in hours) and days[0]["last"] == hours[-1]["last"]


def test_stats_are_chosen_and_several_series_answer_together(store: HistoryStore) -> None:
    missing = SeriesKey("cold-store", "freezer-9", "temperature")
    answer = store.query([TEMP, HUM, missing], T0, T0 + HOUR_MS, period="hour", stats=["max", "count"])
    assert points(answer, 0) == [{"ts": T0, "max": pytest.approx(-14.41), "count": 360}]
    assert points(answer, 1)[0]["max"] == pytest.approx(35.59)
    assert answer["series"][2]["found"] is False and points(answer, 2) == []


def test_every_answer_is_under_32_kb(store: HistoryStore) -> None:
    # 1,000 raw points of two series would be about 130 KB of JSON.
    answer = store.query([TEMP, HUM], T0, T0 + 2 * DAY_MS, period="raw", limit=1000, downsample=False)
    assert answer_bytes(answer) <= MAX_ANSWER_BYTES
    assert answer["thinned"] is True and answer["dropped_points"] > 0
    ts = [p["ts"] for p in points(answer)]
    assert ts[0] == T0 and ts[-1] == T0 + 999 * 10_000  # the first and the last kept
    gaps = {b - a for a, b in pairwise(ts)}
    assert max(gaps) - min(gaps) <= 10_000  # dropped evenly
    small = store.query([TEMP], T0, T0 + HOUR_MS, period="hour")
    assert "thinned" not in small


def test_bound_answer_keeps_what_fits() -> None:
    answer = {"series": [{"points": [{"ts": i, "value": "x" * 50} for i in range(2000)]}]}
    bounded = bound_answer(json.loads(json.dumps(answer)), 4096)
    assert answer_bytes(bounded) <= 4096 and len(bounded["series"][0]["points"]) > 30


def test_queries_the_store_will_not_answer_say_why(store: HistoryStore) -> None:
    with pytest.raises(QueryError, match="1 to 1000"):
        store.query([TEMP], T0, T0 + HOUR_MS, limit=1001)
    with pytest.raises(QueryError, match="raw, 5m, hour, day"):
        store.query([TEMP], T0, T0 + HOUR_MS, period="week")
    with pytest.raises(QueryError, match="mean, min, max, last, count"):
        store.query([TEMP], T0, T0 + HOUR_MS, stats=["median"])
    with pytest.raises(QueryError, match="after the start"):
        store.query([TEMP], T0, T0)


NOW = T0 + 12 * HOUR_MS
JAN_15_8AM = 1_799_971_200_000 + 8 * HOUR_MS  # 2027-01-15T08:00:00Z


@pytest.mark.parametrize(("text", "expected"), [
    ("24h", NOW - DAY_MS), ("7d", NOW - 7 * DAY_MS), ("30m", NOW - 30 * MINUTE_MS), ("-2w", NOW - 14 * DAY_MS),
    ("now-90s", NOW - 90_000), ("1.5h", NOW - 90 * MINUTE_MS), ("now", NOW), (str(T0), T0), (T0, T0),
    ("2027-01-15T08:00:00Z", JAN_15_8AM), ("2027-01-15T10:00:00+02:00", JAN_15_8AM),
    ("2027-01-15T08:00:00", JAN_15_8AM),  # no offset: UTC
])
def test_times_relative_iso_and_epoch(text: str | int, expected: int) -> None:
    assert parse_time(text, NOW) == expected


@pytest.mark.parametrize(("text", "says"), [
    ("24 hours", "is not a time"), ("3y", "unknown unit in '3y'"), ("", "empty time"), ("yesterday", "is not a time"),
    ("2027-13-01", "is not a time"),
])
def test_bad_times_say_what_is_allowed(text: str, says: str) -> None:
    with pytest.raises(TimeSyntaxError, match=says) as err:
        parse_time(text, NOW)
    assert '"24h"' in str(err.value) and "ISO 8601" in str(err.value)


def test_a_range_ends_after_it_starts() -> None:
    assert parse_range("24h", None, NOW) == (NOW - DAY_MS, NOW)
    with pytest.raises(TimeSyntaxError, match="must come after the start"):
        parse_range("1h", "2h", NOW)

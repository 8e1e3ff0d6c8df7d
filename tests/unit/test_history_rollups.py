"""Rollups equal the raw data they summarize, whatever order and batches the samples came in (hypothesis), and
on-change sensors are steps: time-weighted means, values carried forward through silent buckets up to the max hold."""

from __future__ import annotations

import math
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.history.model import FIVE_MINUTES_MS, HOUR_MS, MINUTE_MS, HistorySample, Retention, SeriesKey, Value
from corral.history.store import HistoryStore

T0 = 1_800_000_000_000 - 1_800_000_000_000 % (24 * HOUR_MS)
KEY = SeriesKey("plant", "press-7", "pressure")
DOOR = SeriesKey("plant", "press-7", "guard")

values = st.one_of(st.integers(-1000, 1000), st.floats(-1e6, 1e6, allow_nan=False), st.booleans(),
                   st.sampled_from(["idle", "run"]))
offsets = st.integers(0, 3 * HOUR_MS - 1)
step_values = st.integers(0, 3) | st.booleans() | st.sampled_from(["open", "shut"])


def same(a: float | None, b: float | None) -> bool:
    """Equal as floats may be: sums are added in another order, and answers round means to 9 digits."""
    return (a is None and b is None) or (a is not None and b is not None
                                         and math.isclose(a, b, rel_tol=1e-8, abs_tol=1e-6))


def numeric(value: Value) -> float | None:
    return None if isinstance(value, str) else float(value)


def append_in_batches(store: HistoryStore, sent: list[HistorySample], cuts: list[int]) -> None:
    for lo, hi in zip([0, *sorted(cuts)], [*sorted(cuts), len(sent)], strict=True):
        store.append(sent[lo:hi])


def expected_periodic(kept: dict[int, Value], width: int) -> dict[int, dict[str, Any]]:
    """Each bucket recomputed from the raw samples kept (the first sample of each device ts)."""
    buckets: dict[int, list[tuple[int, Value]]] = defaultdict(list)
    for ts, value in sorted(kept.items()):
        buckets[T0 + (ts - T0) // width * width].append((ts, value))
    out = {}
    for start, members in buckets.items():
        nums = [n for _, v in members if (n := numeric(v)) is not None]
        out[start] = {"count": len(members), "mean": sum(nums) / len(nums) if nums else None,
                      "min": min(nums, default=None), "max": max(nums, default=None), "last": members[-1][1],
                      "last_ts": members[-1][0]}
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(offsets, values), min_size=1, max_size=120), st.lists(st.integers(0, 120), max_size=5),
       st.randoms(use_true_random=False))
def test_periodic_rollups_equal_the_raw_data_whatever_the_order_and_batches(
        drawn: list[tuple[int, Value]], cuts: list[int], shuffle: Any) -> None:
    sent = [HistorySample(KEY, T0 + offset, T0 + offset, value) for offset, value in drawn]
    shuffle.shuffle(sent)  # late samples, out of order
    kept: dict[int, Value] = {}
    for sample in sent:
        kept.setdefault(sample.ts_ms, sample.value)  # the first wins: the rest are replays to ignore
    with tempfile.TemporaryDirectory() as tmp:
        store = HistoryStore(Path(tmp) / "h.db")
        append_in_batches(store, sent, [c for c in cuts if c <= len(sent)])
        store.append(sent)  # and the whole lot replayed
        for period, width in (("5m", FIVE_MINUTES_MS), ("hour", HOUR_MS)):
            answer = store.query([KEY], T0, T0 + 3 * HOUR_MS, period=period, limit=1000)
            got = {p["ts"]: p for p in answer["series"][0]["points"]}
            want = expected_periodic(kept, width)
            assert sorted(got) == sorted(want)
            for start, w in want.items():
                g = got[start]
                assert g["count"] == w["count"] and g["last"] == w["last"] and g["last_ts"] == w["last_ts"]
                assert type(g["last"]) is type(w["last"])
                assert same(g["mean"], w["mean"]) and same(g["min"], w["min"]) and same(g["max"], w["max"])
        day = store.query([KEY], T0, T0 + 3 * HOUR_MS, period="day")["series"][0]["points"]
        assert [p["count"] for p in day] == [len(kept)]
        store.close()


def held_at(kept: list[tuple[int, Value]], t: int, max_hold: int) -> tuple[int, Value] | None:
    """Brute force: the sample whose value holds at time t, if any."""
    before = [(ts, v) for ts, v in kept if ts <= t]
    if not before or t - before[-1][0] >= max_hold:
        return None
    return before[-1]


def expected_step(kept: list[tuple[int, Value]], start: int, width: int, max_hold: int) -> dict[str, Any] | None:
    """A step bucket by brute force, second by second (every time in the test is a whole second)."""
    seconds = [held_at(kept, t, max_hold) for t in range(start, start + width, 1000)]
    held = [h for h in seconds if h is not None]
    if not held:
        return None
    nums = [n for _, v in held if (n := numeric(v)) is not None]
    return {"count": sum(1 for ts, _ in kept if start <= ts < start + width), "mean": sum(nums) / len(nums) if nums else None,
            "min": min(nums, default=None), "max": max(nums, default=None), "last": held[-1][1]}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2 * HOUR_MS // 1000 - 1), step_values),
                min_size=1, max_size=25, unique_by=lambda x: x[0]),
       st.integers(1, 4), st.randoms(use_true_random=False))
def test_step_rollups_are_time_weighted_and_carried_forward_exactly(
        drawn: list[tuple[int, Value]], batches: int, shuffle: Any) -> None:
    max_hold = 20 * MINUTE_MS
    sent = [HistorySample(DOOR, T0 + s * 1000, T0 + s * 1000, v) for s, v in drawn]
    shuffle.shuffle(sent)
    kept = sorted((s.ts_ms, s.value) for s in sent)
    with tempfile.TemporaryDirectory() as tmp:
        store = HistoryStore(Path(tmp) / "h.db", Retention(max_hold_ms=max_hold))
        store.declare(DOOR, step=True)
        size = -(-len(sent) // batches)
        for i in range(0, len(sent), size):
            store.append(sent[i:i + size])
        for period, width in (("5m", FIVE_MINUTES_MS), ("hour", HOUR_MS)):
            answer = store.query([DOOR], T0, T0 + 3 * HOUR_MS, period=period, limit=1000)
            got = {p["ts"]: p for p in answer["series"][0]["points"]}
            for start in range(T0, T0 + 3 * HOUR_MS, width):
                want = expected_step(kept, start, width, max_hold)
                if want is None:
                    assert start not in got, (period, start)
                    continue
                g = got[start]
                assert g["count"] == want["count"] and g["last"] == want["last"], (period, start)
                assert same(g["mean"], want["mean"]) and same(g["min"], want["min"]) and same(g["max"], want["max"])
        store.close()


def test_a_step_mean_is_weighted_by_time_not_by_samples(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    store.declare(DOOR, step=True)
    # Open (1) for the first minute of the hour, then closed (0) for 59 minutes, with a burst of "closed" reports.
    store.append([HistorySample(DOOR, T0, T0, 1.0)] +
                 [HistorySample(DOOR, T0 + MINUTE_MS + i, T0 + MINUTE_MS + i, 0.0) for i in range(10)])
    [hour] = store.query([DOOR], T0, T0 + HOUR_MS, period="hour")["series"][0]["points"]
    assert math.isclose(hour["mean"], 1 / 60, rel_tol=1e-8)  # 11 samples, but the door was open one minute in sixty
    assert hour["min"] == 0.0 and hour["max"] == 1.0 and hour["last"] == 0.0 and hour["count"] == 11
    store.close()


def test_a_step_value_is_carried_through_silent_buckets_up_to_the_max_hold(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db", Retention(max_hold_ms=HOUR_MS))
    store.declare(DOOR, step=True)
    store.append([HistorySample(DOOR, T0 + MINUTE_MS, T0 + MINUTE_MS, True)])
    points = store.query([DOOR], T0, T0 + 2 * HOUR_MS, period="5m", limit=1000)["series"][0]["points"]
    # Held from 00:01 for an hour: buckets 00:00 .. 01:00 (the last one for its first minute), none after.
    assert [p["ts"] for p in points] == [T0 + i * FIVE_MINUTES_MS for i in range(13)]
    assert all(p["last"] is True and p["min"] == p["max"] == 1.0 for p in points)
    assert [p["count"] for p in points] == [1] + [0] * 12
    # A query that starts in the silence still knows the value held from before it.
    later = store.query([DOOR], T0 + 30 * MINUTE_MS, T0 + 35 * MINUTE_MS, period="5m")["series"][0]["points"]
    assert later == [{"ts": T0 + 30 * MINUTE_MS, "mean": 1.0, "min": 1.0, "max": 1.0, "last": True,
                      "last_ts": T0 + MINUTE_MS, "count": 0}]
    store.close()


def test_a_late_step_sample_fixes_the_buckets_after_it(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    store.declare(DOOR, step=True)
    store.append([HistorySample(DOOR, T0, T0, 0.0), HistorySample(DOOR, T0 + 20 * MINUTE_MS, T0 + 20 * MINUTE_MS, 0.0)])
    # A late sample says the value was 1 from minute 2: minute 5 to 20 carried 1 and the 20-minute bucket's
    # carried-in value is ... none, it starts with its own sample. The 0-5 bucket: 2 min at 0, 3 at 1.
    store.append([HistorySample(DOOR, T0 + 2 * MINUTE_MS, T0 + 25 * MINUTE_MS, 1.0)])
    points = store.query([DOOR], T0, T0 + 25 * MINUTE_MS, period="5m")["series"][0]["points"]
    assert [round(p["mean"], 6) for p in points] == [0.6, 1.0, 1.0, 1.0, 0.0]
    store.close()

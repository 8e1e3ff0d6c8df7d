"""Retention by age in bounded steps, and the size bound: the oldest goes first, the newest stays, the file shrinks."""

from __future__ import annotations

from pathlib import Path

from corral.history.model import DAY_MS, HOUR_MS, MINUTE_MS, HistorySample, Retention, SeriesKey
from corral.history.store import HistoryStore

T0 = 1_800_000_000_000 - 1_800_000_000_000 % DAY_MS
KEYS = [SeriesKey("line", f"sensor-{i}", metric) for i in range(5) for metric in ("temperature", "vibration")]


def fill(store: HistoryStore, days: float, every_ms: int, keys: list[SeriesKey] = KEYS) -> int:
    """Samples on every key for `days` from T0; received_ms is the device ts (no clock skew)."""
    steps = int(days * DAY_MS // every_ms)
    for lo in range(0, steps, 2000):
        store.append([HistorySample(key, T0 + i * every_ms, T0 + i * every_ms, float(i % 97) + 0.25)
                      for i in range(lo, min(steps, lo + 2000)) for key in keys])
    return T0 + steps * every_ms


def bounds(store: HistoryStore, table: str, column: str) -> tuple[int | None, int | None]:
    lo, hi = store.conn.execute(f"SELECT min({column}), max({column}) FROM {table}").fetchone()
    return lo, hi


def test_prune_drops_each_resolution_after_its_own_retention(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db", Retention(raw_days=2, five_minute_days=4, hourly_days=6))
    now = fill(store, 8, 10 * MINUTE_MS)
    store.prune_all(now)
    assert bounds(store, "raw", "ts")[0] == now - 2 * DAY_MS
    assert bounds(store, "rollup_5m", "bucket")[0] == now - 4 * DAY_MS
    assert bounds(store, "rollup_1h", "bucket")[0] == now - 6 * DAY_MS
    assert bounds(store, "raw", "ts")[1] == now - 10 * MINUTE_MS  # the newest untouched
    store.close()


def test_prune_works_in_bounded_steps_that_resume_where_they_stopped(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db", Retention(raw_days=1))
    now = fill(store, 3, 10 * MINUTE_MS)
    steps, total = 0, 0
    while True:
        report = store.prune(now, budget_rows=50)
        assert report.deleted <= 50
        total += report.deleted
        steps += 1
        if report.done:
            break
    assert steps > 5 and total == len(KEYS) * 2 * 144  # two days of 144 samples per series went
    assert bounds(store, "raw", "ts")[0] == now - DAY_MS
    assert store.prune(now).deleted == 0
    store.close()


def test_the_size_bound_drops_the_oldest_raw_first_keeps_the_newest_and_shrinks_the_file(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    store = HistoryStore(path)
    now = fill(store, 1.2, 10_000)  # about 100,000 samples
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = store.file_bytes()
    assert before > 3_000_000
    oldest_5m = bounds(store, "rollup_5m", "bucket")[0]

    store.enforce_size(1_000_000)
    assert store.file_bytes() <= 1_000_000
    raw_lo, raw_hi = bounds(store, "raw", "ts")
    assert raw_hi == now - 10_000  # the newest sample is still there
    assert raw_lo is not None and raw_lo > T0  # the oldest went
    assert bounds(store, "rollup_5m", "bucket")[0] == oldest_5m  # raw went first: the rollups summarize it
    answer = store.query([KEYS[0]], now - HOUR_MS, now, period="raw", limit=1000, downsample=False)
    assert len(answer["series"][0]["points"]) == 360
    store.close()
    assert path.stat().st_size <= 1_000_000  # on disk too, after close


def test_under_a_tight_bound_rollups_go_oldest_first_after_raw(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    now = fill(store, 12, 20 * MINUTE_MS, KEYS[:2])
    store.enforce_size(60_000)
    assert store.file_bytes() <= 60_000
    lo5, hi5 = bounds(store, "rollup_5m", "bucket")
    assert hi5 is not None and hi5 >= now - 20 * MINUTE_MS - 5 * MINUTE_MS  # the newest kept
    lo1, _ = bounds(store, "rollup_1h", "bucket")
    assert lo1 is not None and lo5 is not None and lo1 <= lo5  # hourly reaches further back than 5-minute
    store.close()

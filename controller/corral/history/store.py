"""The embedded history store: one SQLite file, one writer (this object), as many readers as like (WAL).

Every method here blocks on disk I/O. The controller must never call them on its event loop: it uses
`corral.history.aio.AsyncHistory`, which runs them on one writer thread (asyncio.to_thread semantics, but always
the same thread, so writes stay ordered and SQLite sees one writer) and queries on reader threads with their own
connections. Tests, the bench and a CLI may call them directly.

Writes come in batches (`append`): one transaction per batch, the raw rows by executemany, so 3,000 samples cost
one fsync-free commit (synchronous=NORMAL in WAL) rather than 3,000. Rows go in sorted by (series, time), so
each B-tree leaf is visited once. A commit rewrites the newest page of each series it touches, so the bigger the
batch the fewer bytes written per sample: see aio.py for the minute-long batches the controller should use.
A sample already kept (same series, same device ts) is ignored, so a replayed batch (a reconnecting device, a
handover that re-sends) does not count twice; of two samples with the same ts the first to arrive is kept.
A sample older than the raw retention (by its own received time) is refused: its bucket could no longer be
recomputed from raw, and the next prune would drop it anyway.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from corral.history import query as queries
from corral.history import retention
from corral.history.answers import MAX_ANSWER_BYTES
from corral.history.buckets import Bucket, Point, carry_forward, combine, step_bucket
from corral.history.model import (
    DAY_MS,
    FIVE_MINUTES_MS,
    HOUR_MS,
    HistorySample,
    Retention,
    SeriesInfo,
    SeriesKey,
    encode,
)
from corral.history.schema import connect

MAX_AHEAD_MS = DAY_MS
Row = tuple[int, int, int, int, int | float | str]  # series id, ts, received - ts, kind, value


def _series_and_time(row: Row) -> tuple[int, int]:
    return row[0], row[1]


class _Queries:
    """Answers over one connection: the writer's (HistoryStore) or a reader's (HistoryReader) answer the same."""

    conn: sqlite3.Connection
    retention: Retention

    def query(self, keys: Sequence[SeriesKey], start_ms: int, end_ms: int, *, period: str = "5m",
              stats: Sequence[str] = queries.STATS, limit: int = queries.DEFAULT_LIMIT, offset: int = 0,
              downsample: bool = True, max_bytes: int = MAX_ANSWER_BYTES) -> dict[str, Any]:
        """See query.query."""
        return queries.query(self.conn, keys, start_ms, end_ms, period=period, stats=stats, limit=limit,
                             offset=offset, downsample=downsample, max_hold_ms=self.retention.max_hold_ms,
                             max_bytes=max_bytes)


class HistoryStore(_Queries):
    """The owner of one history file. Not thread-safe: one thread (the writer thread) uses it at a time."""

    def __init__(self, path: Path | str, retention: Retention | None = None) -> None:
        self.path = Path(path)
        self.retention = retention or Retention()
        self.conn = connect(self.path)
        self._series: dict[SeriesKey, SeriesInfo] = {}
        self._load_series()
        self._prune_cursor = 0  # the series id retention resumes from, so each bounded step makes progress

    def close(self) -> None:
        """Checkpoint the WAL into the main file and close: a restart opens one file, no WAL to replay."""
        try:
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self.conn.close()

    def _load_series(self) -> None:
        """The series map from the file: at open, and after a rolled-back batch (which may have made series)."""
        self._series.clear()
        for row in self.conn.execute("SELECT id, namespace, device, metric, unit, step FROM series"):
            info = SeriesInfo(row[0], SeriesKey(row[1], row[2], row[3]), row[4], bool(row[5]))
            self._series[info.key] = info

    # -- series -------------------------------------------------------------------------------------------------

    def declare(self, key: SeriesKey, *, unit: str | None = None, step: bool = False) -> SeriesInfo:
        """Create the series or update its unit and semantics (from the Device's contract: a bridged on-change
        sensor is a step). A change of `step` applies to samples appended from then on."""
        known = self._series.get(key)
        if known is not None and known.unit == unit and known.step == step:
            return known
        if known is None:
            cur = self.conn.execute("INSERT INTO series (namespace, device, metric, unit, step) VALUES (?, ?, ?, ?, ?)",
                                    (*key, unit, int(step)))
            assert cur.lastrowid is not None
            info = SeriesInfo(cur.lastrowid, key, unit, step)
        else:
            self.conn.execute("UPDATE series SET unit = ?, step = ? WHERE id = ?", (unit, int(step), known.id))
            info = SeriesInfo(known.id, key, unit, step)
        self._series[key] = info
        return info

    def series(self, key: SeriesKey) -> SeriesInfo | None:
        return self._series.get(key)

    def all_series(self) -> list[SeriesInfo]:
        return sorted(self._series.values(), key=lambda info: info.id)

    # -- writing ------------------------------------------------------------------------------------------------

    def append(self, samples: Iterable[HistorySample]) -> int:
        """Keep a batch of samples in one transaction; returns how many were new (replays and samples older than
        the raw retention are not, nor samples stamped more than a day ahead of their arrival: a device clock
        that far off would plant rows no retention reaches). Unknown series are created as periodic, no unit."""
        horizon = int(self.retention.raw_days * DAY_MS)
        rows: list[Row] = []
        steps: dict[int, list[int]] = defaultdict(list)
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            for sample in samples:
                if not sample.received_ms - horizon <= sample.ts_ms <= sample.received_ms + MAX_AHEAD_MS:
                    continue
                info = self._series.get(sample.key) or self.declare(sample.key)
                kind, stored = encode(sample.value)
                rows.append((info.id, sample.ts_ms, int(sample.received_ms) - sample.ts_ms, kind, stored))
                if info.step:
                    steps[info.id].append(sample.ts_ms)
            # Periodic and step rows go in separately: total_changes counts the triggers' two rollup upserts per new
            # periodic row (and nothing for an ignored one), so the count of new rows is exact for both.
            rows.sort(key=_series_and_time)  # each B-tree leaf visited once; stable, so the first arrival wins
            step_ids = set(steps)
            added = self._insert([row for row in rows if row[0] not in step_ids], per_row=3)
            added += self._insert([row for row in rows if row[0] in step_ids], per_row=1)
            for series_id, stamps in steps.items():
                self._recompute_steps(series_id, stamps)
        except BaseException:
            self.conn.execute("ROLLBACK")
            self._load_series()
            raise
        self.conn.execute("COMMIT")
        return added

    def _insert(self, rows: Sequence[Row], per_row: int) -> int:
        if not rows:
            return 0
        before = self.conn.total_changes
        self.conn.executemany("INSERT OR IGNORE INTO raw (series, ts, received, kind, value) VALUES (?, ?, ?, ?, ?)",
                              rows)
        return (self.conn.total_changes - before) // per_row

    def _recompute_steps(self, series_id: int, stamps: Sequence[int]) -> None:
        """Recompute the buckets a step sample changes: its own 5-minute bucket from raw, and that of the sample
        after it (whose carried-in value it now is); then each touched hour from its twelve 5-minute buckets
        (exact: weights and sums add), so a sensor that changes every second costs 300 rows a recompute, not
        3,600. Buckets between samples hold no rows; queries carry values through them."""
        starts: set[int] = set()
        for ts in stamps:
            starts.add(ts - ts % FIVE_MINUTES_MS)
            after = self.conn.execute("SELECT ts FROM raw WHERE series = ? AND ts > ? ORDER BY ts LIMIT 1",
                                      (series_id, ts)).fetchone()
            if after is not None:
                starts.add(after[0] - after[0] % FIVE_MINUTES_MS)
        for start in sorted(starts):
            self._store_bucket("rollup_5m", series_id, start, self._step_from_raw(series_id, start))
        for hour in sorted({start - start % HOUR_MS for start in starts}):
            self._store_bucket("rollup_1h", series_id, hour, self._hour_from_5m(series_id, hour))

    def _step_from_raw(self, series_id: int, start: int) -> Bucket | None:
        points: list[Point] = [(ts, kind, value) for ts, kind, value in self.conn.execute(
            "SELECT ts, kind, value FROM raw WHERE series = ? AND ts >= ? AND ts < ? ORDER BY ts",
            (series_id, start, start + FIVE_MINUTES_MS))]
        before = self.conn.execute("SELECT ts, kind, value FROM raw WHERE series = ? AND ts < ? ORDER BY ts DESC LIMIT 1",
                                   (series_id, start)).fetchone()
        return step_bucket(start, FIVE_MINUTES_MS, points, tuple(before) if before else None,
                           self.retention.max_hold_ms)

    def _hour_from_5m(self, series_id: int, hour: int) -> Bucket | None:
        columns = "bucket, count, weight, sum, min, max, last, last_kind, last_ts"
        rows = [Bucket(*row) for row in self.conn.execute(
            f"SELECT {columns} FROM rollup_5m WHERE series = ? AND bucket >= ? AND bucket < ? ORDER BY bucket",
            (series_id, hour, hour + HOUR_MS))]
        before = self.conn.execute(f"SELECT {columns} FROM rollup_5m WHERE series = ? AND bucket < ? "
                                   "ORDER BY bucket DESC LIMIT 1", (series_id, hour)).fetchone()
        filled = carry_forward(rows, Bucket(*before) if before else None, hour, hour + HOUR_MS, FIVE_MINUTES_MS,
                               self.retention.max_hold_ms)
        return combine(hour, filled)

    def _store_bucket(self, table: str, series_id: int, start: int, bucket: Bucket | None) -> None:
        """Keep a step bucket that has samples; a bucket without any is left to the queries' carry-forward."""
        if bucket is None or not bucket.count:
            self.conn.execute(f"DELETE FROM {table} WHERE series = ? AND bucket = ?", (series_id, start))
            return
        self.conn.execute(
            f"INSERT OR REPLACE INTO {table} (series, bucket, count, weight, sum, min, max, last, last_kind, last_ts) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (series_id, start, bucket.count, bucket.weight, bucket.sum, bucket.min, bucket.max, bucket.last,
             bucket.last_kind, bucket.last_ts))

    # -- retention and reading ----------------------------------------------------------------------------------

    def prune(self, now_ms: int, budget_rows: int = retention.DEFAULT_BUDGET) -> retention.PruneReport:
        """One bounded step of retention (see retention.py); call again while the report says not done."""
        report, self._prune_cursor = retention.prune_step(self.conn, self.retention.cutoffs(now_ms),
                                                          self._prune_cursor, budget_rows)
        if report.done:
            retention.shrink(self.conn)  # a full pass is over: hand the freed pages back to the file system
        return report

    def prune_all(self, now_ms: int) -> int:
        """Retention to the end, then the size bound: for tests and the CLI; the controller steps through prune()."""
        deleted = 0
        while True:
            report = self.prune(now_ms)
            deleted += report.deleted
            if report.done:
                break
        if self.retention.max_bytes is not None:
            deleted += retention.enforce_size(self.conn, self.retention.max_bytes)
        return deleted

    def enforce_size(self, max_bytes: int | None = None) -> int:
        bound = max_bytes if max_bytes is not None else self.retention.max_bytes
        return 0 if bound is None else retention.enforce_size(self.conn, bound)

    def file_bytes(self) -> int:
        return retention.file_bytes(self.path)



class HistoryReader(_Queries):
    """A read-only connection to a history file, for a thread other than the writer's (WAL: reads never wait for
    the writer, and see the last committed batch)."""

    def __init__(self, path: Path | str, retention: Retention | None = None) -> None:
        self.path = Path(path)
        self.retention = retention or Retention()
        self.conn = connect(self.path, readonly=True)

    def close(self) -> None:
        self.conn.close()

"""Retention and the size bound: deleting old history in bounded steps, and giving the space back.

Both delete series by series along the primary key (series, time), never with one table-wide DELETE: a step
deletes at most `budget_rows` rows in one short transaction, so an append waiting for the writer waits
milliseconds, not seconds. The tables have no index on time alone (it would cost every insert and a third more
disk), so the oldest time of a table is found as the minimum over its series, one primary-key seek each.

The size bound drops the OLDEST data first, tier by tier: raw samples first (they are the bulk, over ten times
the rollups per day at a sample every 10 s, and the rollups still summarize what they held), then 5-minute
rollups, then hourly ones. Each tier first keeps a floor of its newest data (raw 1 hour, 5-minute 1 day, hourly
7 days), so "what is it doing now" and the long trend survive together; only if all tiers are down to their
floors and the file is still too big do the floors go too, in the same order. The file is created with
auto_vacuum=INCREMENTAL: `PRAGMA incremental_vacuum` hands freed pages back and a WAL checkpoint (TRUNCATE)
makes the file on disk actually shrink.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from corral.history.model import DAY_MS, FIVE_MINUTES_MS, HOUR_MS

DEFAULT_BUDGET: Final = 20_000
# Series visited per step at most, so a step over many nearly empty series is bounded too.
SERIES_PER_STEP: Final = 2_000
# (table, time column, the newest span kept before the floors go, the least one cut advances by).
TIERS: Final = (("raw", "ts", HOUR_MS, FIVE_MINUTES_MS),
                ("rollup_5m", "bucket", DAY_MS, HOUR_MS),
                ("rollup_1h", "bucket", 7 * DAY_MS, DAY_MS))
TIME_COLUMN: Final = {table: column for table, column, _, _ in TIERS}


@dataclass(frozen=True)
class PruneReport:
    deleted: int
    done: bool  # False: the budget ran out before every series was visited; call again


def prune_step(conn: sqlite3.Connection, cutoffs: dict[str, int], cursor: int,
               budget_rows: int = DEFAULT_BUDGET) -> tuple[PruneReport, int]:
    """Delete what is older than each table's cutoff, for series from `cursor` on, at most budget_rows rows in
    one transaction. Returns the report and the cursor to resume from (0 when a full pass is done)."""
    ids = [row[0] for row in conn.execute("SELECT id FROM series WHERE id >= ? ORDER BY id LIMIT ?",
                                          (cursor, SERIES_PER_STEP + 1))]
    deleted = 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        for series_id in ids[:SERIES_PER_STEP]:
            for table, cutoff in cutoffs.items():
                deleted += _delete_older(conn, table, series_id, cutoff, budget_rows - deleted)
            if deleted >= budget_rows:
                conn.execute("COMMIT")
                return PruneReport(deleted, False), series_id  # this series may have more: resume on it
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    if len(ids) > SERIES_PER_STEP:
        return PruneReport(deleted, False), ids[SERIES_PER_STEP]
    return PruneReport(deleted, True), 0


def _delete_older(conn: sqlite3.Connection, table: str, series_id: int, cutoff: int, budget: int) -> int:
    """Delete up to `budget` rows of one series older than cutoff, oldest first."""
    if budget <= 0:
        return 0
    column = TIME_COLUMN[table]
    nth = conn.execute(f"SELECT {column} FROM {table} WHERE series = ? AND {column} < ? ORDER BY {column} "
                       "LIMIT 1 OFFSET ?", (series_id, cutoff, budget)).fetchone()
    limit = cutoff if nth is None else nth[0]
    cur = conn.execute(f"DELETE FROM {table} WHERE series = ? AND {column} < ?", (series_id, limit))
    return cur.rowcount


def used_bytes(conn: sqlite3.Connection) -> int:
    """The bytes the database's pages take, free pages left out (what incremental_vacuum would leave)."""
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    return int(page_size * (pages - free))


def file_bytes(path: Path) -> int:
    """The history on disk: the file and its WAL (the shared-memory index is not data)."""
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def shrink(conn: sqlite3.Connection) -> None:
    """Give free pages back to the file system: truncate the file, then fold the WAL into it and cut the WAL."""
    # It frees one page per step; Python's execute() steps a row-less statement once, executescript() to the end.
    conn.executescript("PRAGMA incremental_vacuum;")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def enforce_size(conn: sqlite3.Connection, max_bytes: int, budget_rows: int = DEFAULT_BUDGET) -> int:
    """Drop the oldest history, tier by tier (see the module docstring), until the file is under max_bytes."""
    deleted = 0
    for use_floors in (True, False):
        for table, column, floor, least in TIERS:
            while used_bytes(conn) > max_bytes:
                cut = _next_cut(conn, table, column, floor if use_floors else 0, least)
                if cut is None:
                    break
                deleted += _delete_before(conn, table, cut, budget_rows)
                shrink(conn)
    shrink(conn)
    return deleted


def _next_cut(conn: sqlite3.Connection, table: str, column: str, floor: int, least: int) -> int | None:
    """The time to cut the table below next: an eighth of what may go, at least `least`; None if nothing may."""
    bounds = conn.execute(f"SELECT min(lo), max(hi) FROM (SELECT (SELECT min({column}) FROM {table} WHERE series = s.id)"
                          f" AS lo, (SELECT max({column}) FROM {table} WHERE series = s.id) AS hi FROM series s)").fetchone()
    oldest, newest = bounds
    if oldest is None:
        return None
    limit = newest + 1 - floor
    if oldest >= limit:
        return None
    return int(min(limit, oldest + max(least, (limit - oldest) // 8)))


def _delete_before(conn: sqlite3.Connection, table: str, cut: int, budget_rows: int) -> int:
    """Delete every row older than cut, committing each time budget_rows rows went, so writers get their turn."""
    deleted = in_transaction = 0
    ids = [row[0] for row in conn.execute("SELECT id FROM series ORDER BY id")]
    conn.execute("BEGIN IMMEDIATE")
    try:
        for series_id in ids:
            while True:
                gone = _delete_older(conn, table, series_id, cut, budget_rows - in_transaction)
                deleted, in_transaction = deleted + gone, in_transaction + gone
                if in_transaction < budget_rows:
                    break
                conn.execute("COMMIT")
                conn.execute("BEGIN IMMEDIATE")
                in_transaction = 0
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return deleted

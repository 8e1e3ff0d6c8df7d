"""The history file: how it is opened, its tables, and the one-way migrations between schema versions.

One SQLite file per controller ordinal, in WAL mode so readers never block the writer (nor it them), with
`synchronous=NORMAL` (a power cut may lose the last transactions, never corrupt the file: the right trade for
samples, which arrive again every few seconds) and a busy timeout so a reader's checkpoint does not fail a write.
`auto_vacuum=INCREMENTAL` is set before the first table so deleted pages can be handed back to the file system
(retention and the size bound call `PRAGMA incremental_vacuum`); it cannot be turned on later without a VACUUM.
The writer also gets a 64 MiB page cache and statement journals in memory (see connect()).

Tables (every one keyed by series then time, WITHOUT ROWID, so a series' range is one contiguous B-tree walk and
the key is not stored twice):
- `series`: (namespace, device, metric) -> a small integer id, with the unit and the step flag;
- `raw`: one row per sample, the primary key (series, ts) makes a replayed sample a no-op (INSERT OR IGNORE);
  `received` is kept as received_ms - ts (a few bytes instead of eight);
- `rollup_5m`, `rollup_1h`: one row per series and bucket start: count, weight, sum, min, max, last (+ its kind
  and device ts). mean = sum / weight, where weight is the number of numeric samples for a periodic series and
  the milliseconds the value was held for a step series, so coarser periods re-aggregate exactly by adding.
Periodic series' rollups are kept by triggers on `raw` (they fire only for rows really inserted, which is what
makes replay idempotent); step series' buckets are recomputed from raw by the store (`steps.py`).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Final

SCHEMA_VERSION: Final = 1
BUSY_TIMEOUT_MS: Final = 5_000
# After a checkpoint the WAL file is cut back to this size, so it does not keep its high-water mark on disk.
WAL_SIZE_LIMIT: Final = 4 * 1024 * 1024
# The writer's page cache, in KiB (SQLite's default is 2 MiB). Every batch touches the newest leaf page of every
# series (30,000 of them at 10,000 devices: about 120 MiB of leaves); a bigger cache keeps the hot ones in the
# process instead of re-reading them from the OS each batch. Readers keep the default.
WRITER_CACHE_KIB: Final = 64 * 1024


class SchemaTooNew(RuntimeError):
    """The file was written by a newer Corral: reading it with older code could misread or damage it."""


def _rollup_table(name: str) -> str:
    return f"""
CREATE TABLE {name} (
    series INTEGER NOT NULL,
    bucket INTEGER NOT NULL,
    count INTEGER NOT NULL,
    weight REAL NOT NULL,
    sum REAL NOT NULL,
    min REAL,
    max REAL,
    last,
    last_kind INTEGER NOT NULL,
    last_ts INTEGER NOT NULL,
    PRIMARY KEY (series, bucket)
) WITHOUT ROWID"""


def _periodic_trigger(table: str, width_ms: int) -> str:
    """Fold one newly inserted raw row of a periodic series into its bucket. In an upsert's SET every right-hand
    side reads the row as it was before, so `last` and `last_ts` are compared with the old `last_ts`. coalesce()
    lets a text sample (no min/max) share a bucket with numbers without turning min/max into NULL."""
    numeric = "NEW.kind != 2"
    return f"""
CREATE TRIGGER {table}_periodic AFTER INSERT ON raw
WHEN (SELECT step FROM series WHERE id = NEW.series) = 0
BEGIN
    INSERT INTO {table} (series, bucket, count, weight, sum, min, max, last, last_kind, last_ts)
    VALUES (NEW.series, NEW.ts - NEW.ts % {width_ms}, 1,
            CASE WHEN {numeric} THEN 1 ELSE 0 END, CASE WHEN {numeric} THEN NEW.value ELSE 0 END,
            CASE WHEN {numeric} THEN NEW.value END, CASE WHEN {numeric} THEN NEW.value END,
            NEW.value, NEW.kind, NEW.ts)
    ON CONFLICT (series, bucket) DO UPDATE SET
        count = count + 1,
        weight = weight + excluded.weight,
        sum = sum + excluded.sum,
        min = min(coalesce(min, excluded.min), coalesce(excluded.min, min)),
        max = max(coalesce(max, excluded.max), coalesce(excluded.max, max)),
        last = CASE WHEN excluded.last_ts > last_ts THEN excluded.last ELSE last END,
        last_kind = CASE WHEN excluded.last_ts > last_ts THEN excluded.last_kind ELSE last_kind END,
        last_ts = max(last_ts, excluded.last_ts);
END"""


# Each entry takes the file from the version before it to its own; they run in order, each in one transaction.
MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    1: (
        """CREATE TABLE series (
            id INTEGER PRIMARY KEY,
            namespace TEXT NOT NULL,
            device TEXT NOT NULL,
            metric TEXT NOT NULL,
            unit TEXT,
            step INTEGER NOT NULL DEFAULT 0,
            UNIQUE (namespace, device, metric))""",
        """CREATE TABLE raw (
            series INTEGER NOT NULL,
            ts INTEGER NOT NULL,
            received INTEGER NOT NULL,
            kind INTEGER NOT NULL,
            value,
            PRIMARY KEY (series, ts)
        ) WITHOUT ROWID""",
        _rollup_table("rollup_5m"),
        _rollup_table("rollup_1h"),
        _periodic_trigger("rollup_5m", 5 * 60_000),
        _periodic_trigger("rollup_1h", 60 * 60_000),
    ),
}


def connect(path: Path | str, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection with the store's pragmas, the schema brought up to date (by the writer) or checked (by a
    reader). Autocommit mode (isolation_level=None): the store opens its transactions itself, explicitly."""
    path = Path(path)
    if readonly:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        _refuse_newer(path, version)
        if not readonly:
            if version == 0:
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # before the first table, and before WAL
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
            conn.execute(f"PRAGMA cache_size = -{WRITER_CACHE_KIB}")
            # Statement journals in memory: each row of an executemany is a statement (triggers, upserts), and a
            # statement journal on disk wrote 1.6 GiB for a 180,000-sample batch (bench/history_store.py).
            conn.execute("PRAGMA temp_store = MEMORY")
            _migrate(conn, version)
        conn.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        conn.close()
        raise
    return conn


def _refuse_newer(path: Path, version: int) -> None:
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"history file {path} has schema version {version}, but this Corral reads versions up to "
            f"{SCHEMA_VERSION}: it was written by a newer Corral. Run that version, or point the history at a new "
            "file; this one is left untouched.")


def _migrate(conn: sqlite3.Connection, version: int) -> None:
    for target in range(version + 1, SCHEMA_VERSION + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[target]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {target}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

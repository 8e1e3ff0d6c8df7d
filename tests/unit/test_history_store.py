"""The embedded history store: appending batches, replay, values as sent, restart, schema versions, readers."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from corral.history.aio import AsyncHistory
from corral.history.model import DAY_MS, HistorySample, Retention, SeriesKey
from corral.history.schema import SCHEMA_VERSION, SchemaTooNew
from corral.history.store import HistoryReader, HistoryStore

T0 = 1_800_000_000_000 - 1_800_000_000_000 % DAY_MS  # a UTC midnight
TEMP = SeriesKey("farm", "freezer-1", "temperature")
DOOR = SeriesKey("farm", "freezer-1", "door")
MODE = SeriesKey("farm", "freezer-1", "mode")


def samples(key: SeriesKey, count: int, every_ms: int = 10_000, start: int = T0) -> list[HistorySample]:
    return [HistorySample(key, start + i * every_ms, start + i * every_ms + 40, -18.0 + (i % 5) / 2) for i in range(count)]


def raw_values(store: HistoryStore | HistoryReader, key: SeriesKey, start: int = T0, end: int = T0 + DAY_MS) -> list[object]:
    answer = store.query([key], start, end, period="raw", limit=1000, downsample=False)
    return [p["value"] for p in answer["series"][0]["points"]]


def test_a_batch_is_kept_and_a_replayed_batch_counts_nothing_twice(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    batch = samples(TEMP, 300)
    assert store.append(batch) == 300
    assert store.append(batch) == 0  # the same samples again: a reconnecting device re-sends
    assert store.append([*batch[-10:], *samples(TEMP, 5, start=T0 + 300 * 10_000)]) == 5
    # Two samples with one ts in one batch, a text and a number: the first to arrive is kept, the other ignored.
    twice = [HistorySample(MODE, T0, T0, "defrost"), HistorySample(MODE, T0, T0 + 1, 3.5)]
    assert store.append(twice) == 1 and raw_values(store, MODE) == ["defrost"]
    counts = store.query([TEMP], T0, T0 + DAY_MS, period="hour")["series"][0]["points"]
    assert sum(p["count"] for p in counts) == 305
    assert store.conn.execute("SELECT count(*) FROM raw").fetchone()[0] == 306  # with the one of MODE
    store.close()


def test_values_come_back_as_the_device_sent_them(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    sent = [21, 21.5, True, False, "defrost", 0, 1, -(2**63)]
    store.append([HistorySample(MODE, T0 + i * 1000, T0 + i * 1000, value) for i, value in enumerate(sent)])
    back = raw_values(store, MODE)
    assert back == sent
    assert [type(v) for v in back] == [type(v) for v in sent]  # 21 is not 21.0, True is not 1
    # An integer too big for SQLite's 64 bits is kept as a float rather than failing the whole batch.
    assert store.append([HistorySample(MODE, T0 + 60_000, T0 + 60_000, 2**70)]) == 1
    assert raw_values(store, MODE)[-1] == float(2**70)
    answer = store.query([MODE], T0, T0 + 1000, period="raw")
    point = answer["series"][0]["points"][0]
    assert point == {"ts": T0, "received_ms": T0, "value": 21}
    store.close()


def test_a_text_series_keeps_last_and_count_only(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    store.append([HistorySample(MODE, T0 + i * 1000, T0 + i * 1000, state) for i, state in enumerate(["idle", "cool", "defrost"])])
    [point] = store.query([MODE], T0, T0 + 300_000, period="5m")["series"][0]["points"]
    assert point["last"] == "defrost" and point["count"] == 3
    assert point["mean"] is None and point["min"] is None and point["max"] is None
    store.close()


def test_a_sample_older_than_the_raw_retention_is_refused(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db", Retention(raw_days=10))
    late = HistorySample(TEMP, T0, T0 + 11 * DAY_MS, 1.0)
    assert store.append([late]) == 0
    assert store.append([HistorySample(TEMP, T0, T0 + 9 * DAY_MS, 1.0)]) == 1  # late, yet within the retention
    assert store.append([HistorySample(TEMP, T0 + 2 * DAY_MS, T0, 1.0)]) == 0  # a clock two days ahead
    store.close()


def test_a_failed_batch_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = HistoryStore(tmp_path / "h.db")
    new_key = SeriesKey("farm", "freezer-2", "temperature")
    insert = store._insert

    def insert_then_fail(rows: list[Any], per_row: int) -> int:
        insert(rows, per_row)
        raise OSError("disk full")

    monkeypatch.setattr(store, "_insert", insert_then_fail)
    with pytest.raises(OSError, match="disk full"):
        store.append(samples(new_key, 3))
    monkeypatch.undo()
    assert store.series(new_key) is None and store.conn.execute("SELECT count(*) FROM raw").fetchone()[0] == 0
    assert store.append(samples(new_key, 3)) == 3
    store.close()


def test_everything_is_there_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    store = HistoryStore(path)
    store.declare(DOOR, unit=None, step=True)
    store.declare(TEMP, unit="°C")
    store.append(samples(TEMP, 500))
    store.append([HistorySample(DOOR, T0, T0, True), HistorySample(DOOR, T0 + 3_600_000, T0 + 3_600_000, False)])
    before = {p: store.query([TEMP, DOOR], T0, T0 + DAY_MS, period=p, limit=1000) for p in ("raw", "5m", "hour", "day")}
    store.close()
    assert not Path(str(path) + "-wal").exists() or Path(str(path) + "-wal").stat().st_size == 0

    again = HistoryStore(path)
    temp, door = again.series(TEMP), again.series(DOOR)
    assert temp is not None and temp.unit == "°C"
    assert door is not None and door.step
    for period, answer in before.items():
        assert again.query([TEMP, DOOR], T0, T0 + DAY_MS, period=period, limit=1000) == answer
    assert again.append(samples(TEMP, 500)) == 0  # still idempotent across the restart
    again.close()


def test_a_file_from_a_newer_corral_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    HistoryStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SchemaTooNew, match=rf"schema version {SCHEMA_VERSION + 1}.*up to {SCHEMA_VERSION}.*newer Corral"):
        HistoryStore(path)
    with pytest.raises(SchemaTooNew):
        HistoryReader(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    conn.close()


def test_the_file_is_wal_with_incremental_vacuum_and_a_versioned_schema(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    assert store.conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # normal
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    store.close()


def test_a_reader_sees_what_the_writer_committed_while_the_writer_goes_on(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    store.append(samples(TEMP, 10))
    reader = HistoryReader(tmp_path / "h.db")
    assert len(raw_values(reader, TEMP)) == 10
    store.append(samples(TEMP, 10, start=T0 + 100_000))
    assert len(raw_values(reader, TEMP)) == 20
    with pytest.raises(sqlite3.OperationalError):
        reader.conn.execute("DELETE FROM raw")
    reader.close()
    store.close()


def test_the_async_wrapper_keeps_the_event_loop_free(tmp_path: Path) -> None:
    async def scenario() -> dict[str, Any]:
        history = await AsyncHistory.open(tmp_path / "h.db")
        await history.declare(DOOR, step=True)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        assert await history.append(samples(TEMP, 5000)) == 5000
        answer = await history.query([TEMP], T0, T0 + DAY_MS, period="5m")
        assert await history.prune(T0 + 30 * DAY_MS) > 0
        task.cancel()
        await history.close()
        assert ticks > 1  # the loop went on running while the batch was written
        return answer

    answer = asyncio.run(scenario())
    assert sum(p["count"] for p in answer["series"][0]["points"]) == 5000


def test_staged_samples_are_written_by_a_flush_or_at_close(tmp_path: Path) -> None:
    async def scenario() -> None:
        history = await AsyncHistory.open(tmp_path / "h.db")
        history.stage(samples(TEMP, 100))
        history.stage(samples(TEMP, 100))  # the same again: written once
        assert history.store.conn.execute("SELECT count(*) FROM raw").fetchone()[0] == 0  # staging does no I/O
        assert await history.flush() == 100
        history.max_staged = 50
        history.stage(samples(DOOR, 60))  # over max_staged: a flush starts by itself
        history.stage(samples(MODE, 10))
        await history.close()  # ... and close() writes what is left

    asyncio.run(scenario())
    reopened = HistoryStore(tmp_path / "h.db")
    assert reopened.conn.execute("SELECT count(*) FROM raw").fetchone()[0] == 170
    reopened.close()

"""The history store for the event loop: every blocking call runs on a thread, never on the loop.

SQLite calls block (disk I/O, and a busy wait when a checkpoint holds the file), so the controller calls the store
only through this wrapper. Writes go to ONE writer thread that owns the HistoryStore (its connection is used by no
other thread, and batches are applied in the order they were submitted); queries go to a small pool of reader
threads, each with its own read-only connection (WAL lets them read while the writer writes). Retention is run in
bounded steps, each submitted separately, so appends queued meanwhile go between the steps.

Batching: raw rows are kept series by series, so a commit rewrites (in the WAL, then again at the checkpoint)
the newest page of every series it touches, whatever the number of samples it adds to it. Once every series has
its own newest page, a batch costs about 2 x 4 KiB x the series in it: the bytes written per sample fall with the
batch's length (bench/history_store.py --minutes 30, 10,000 devices x 3 metrics every 10 s: about 0.9 KB a
sample, 2.6 MiB/s, with a batch a minute; 0.2 KB, 0.6 MiB/s, with a batch every 5 minutes). So the controller `stage()`s
samples as they arrive (no I/O, on the loop) and `flush_every(interval)` writes them in one batch per interval
(earlier when `max_staged` are waiting). A crash loses at most the staged interval; the in-memory ring buffers
(devices/telemetry.py) hold the last five minutes anyway. The structural fix for flash wear at fleet size is a
chunked raw layout (a row per series per few minutes of packed samples); see issue 42's note.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from corral.history.model import HistorySample, Retention, SeriesInfo, SeriesKey
from corral.history.retention import PruneReport
from corral.history.store import HistoryReader, HistoryStore

T = TypeVar("T")


class AsyncHistory:
    """Open with `await AsyncHistory.open(path)`; close with `await history.close()`."""

    def __init__(self, path: Path | str, retention: Retention | None = None, readers: int = 2) -> None:
        self.path = Path(path)
        self.retention = retention or Retention()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="history-writer")
        self._readers = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="history-reader")
        self._local = threading.local()
        self._reader_conns: list[HistoryReader] = []
        self._lock = threading.Lock()
        self._store: HistoryStore | None = None
        self._staged: list[HistorySample] = []
        self.max_staged = 500_000
        self._flushing: set[asyncio.Task[int]] = set()

    @classmethod
    async def open(cls, path: Path | str, retention: Retention | None = None, readers: int = 2) -> AsyncHistory:
        history = cls(path, retention, readers)
        history._store = await history._write(lambda: HistoryStore(history.path, history.retention))
        return history

    async def _write(self, call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._writer, call)

    @property
    def store(self) -> HistoryStore:
        if self._store is None:
            raise RuntimeError("AsyncHistory is not open: use `await AsyncHistory.open(path)`")
        return self._store

    async def declare(self, key: SeriesKey, *, unit: str | None = None, step: bool = False) -> SeriesInfo:
        store = self.store
        return await self._write(lambda: store.declare(key, unit=unit, step=step))

    async def declare_all(self, shapes: Mapping[SeriesKey, tuple[str | None, bool]]) -> None:
        """declare() for many series (key -> (unit, step)) in one trip to the writer thread: a fleet's first
        samples after a start name every series once, and one hop each would be thousands."""
        batch, store = dict(shapes), self.store
        await self._write(lambda: [store.declare(key, unit=unit, step=step) for key, (unit, step) in batch.items()])

    async def append(self, samples: Iterable[HistorySample]) -> int:
        batch, store = list(samples), self.store
        return await self._write(lambda: store.append(batch))

    async def prune(self, now_ms: int) -> int:
        """Retention to the end in bounded steps (appends go in between), then the size bound."""
        store, deleted = self.store, 0
        while True:
            report: PruneReport = await self._write(lambda: store.prune(now_ms))
            deleted += report.deleted
            if report.done:
                break
        return deleted + await self._write(store.enforce_size)

    def stage(self, samples: Iterable[HistorySample]) -> None:
        """Keep samples for the next flush: no I/O, safe to call on the loop for every telemetry message. Past
        max_staged waiting samples a flush starts at once, so memory stays bounded if the flusher lags."""
        self._staged.extend(samples)
        if len(self._staged) >= self.max_staged:
            task = asyncio.get_running_loop().create_task(self.flush())
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)

    async def flush(self) -> int:
        """Write what is staged, in one batch; returns how many samples were new."""
        batch, self._staged = self._staged, []
        return await self.append(batch) if batch else 0

    async def flush_every(self, interval_s: float = 60.0) -> None:
        """Run as a task for the store's life: a flush each interval (cancel it, then close() flushes the rest)."""
        while True:
            await asyncio.sleep(interval_s)
            await self.flush()

    def _reader(self) -> HistoryReader:
        reader: HistoryReader | None = getattr(self._local, "reader", None)
        if reader is None:
            reader = self._local.reader = HistoryReader(self.path, self.retention)
            with self._lock:
                self._reader_conns.append(reader)
        return reader

    async def query(self, keys: Sequence[SeriesKey], start_ms: int, end_ms: int, **options: Any) -> dict[str, Any]:
        """HistoryStore.query's options, answered on a reader thread."""
        return await asyncio.get_running_loop().run_in_executor(
            self._readers, lambda: self._reader().query(keys, start_ms, end_ms, **options))

    async def close(self) -> None:
        """Flush what is staged, close the readers, checkpoint and close the writer."""
        if self._store is not None:
            await asyncio.gather(*self._flushing)
            await self.flush()
        self._readers.shutdown(wait=True)
        with self._lock:
            for reader in self._reader_conns:
                reader.close()
        if self._store is not None:
            await self._write(self._store.close)
        self._writer.shutdown(wait=True)

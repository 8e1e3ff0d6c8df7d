"""The controller's history of samples: every sample telemetry ingest accepts is kept in the embedded store
(corral.history), opt-in with `corral run --history-dir`.

The event loop never waits on SQLite: ingest `record()`s samples (staged in memory, no I/O), a task writes them in
one batch every `history_flush_s`, another runs retention and the size bound hourly, and queries run on the
store's reader threads. One file per replica (`history-<name>.sqlite3`), held with an exclusive lock: two writers
would each cache series ids the other does not know. A replica records only the devices of the shards it owns
(the MQTT side drops the others' telemetry before ingest), so each sample is kept once.

A series is one metric of one Device, by the Device's namespace and name (what a reader asks for and is
authorized on), declared with the unit of the contract's sensor. Only metrics the contract declares as sensors are
kept: a device that invents metric names makes the ring buffers keep a few (devices.telemetry.MAX_METRICS) for a
while, but could otherwise make the store keep series forever.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from corral.contract.model import Contract
from corral.devices.messages import Sample
from corral.history.aio import AsyncHistory
from corral.history.model import HistorySample, Retention, SeriesKey
from corral.obs import metrics

log = logging.getLogger(__name__)

Owner = Callable[[str], tuple[str, str] | None]  # device id -> the (namespace, name) of the Device bound to it
Shape = tuple[str | None, bool]  # a series' unit and whether it is a step


def history_file(directory: Path | str, name: str) -> Path:
    return Path(directory) / f"history-{name}.sqlite3"


class HistoryInUse(RuntimeError):
    """Another process writes this history file."""


class HistoryFeed:
    """Opened at start (`await open()`), closed at stop (`await close()`, which writes what is staged)."""

    def __init__(self, path: Path, retention: Retention, owner: Owner, flush_s: float = 5.0,
                 prune_s: float = 3600.0) -> None:
        self.path, self.retention, self.owner = path, retention, owner
        self.flush_s, self.prune_s = flush_s, prune_s
        self._history: AsyncHistory | None = None
        self._lock: int | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._declared: dict[SeriesKey, Shape] = {}  # as this process last declared each series
        self._pending: dict[SeriesKey, Shape] = {}
        self._declaring: set[asyncio.Task[None]] = set()

    @property
    def history(self) -> AsyncHistory:
        if self._history is None:
            raise RuntimeError("the history is not open")
        return self._history

    async def open(self) -> None:
        await asyncio.to_thread(self._take_lock)
        self._history = await AsyncHistory.open(self.path, self.retention)
        self._tasks = [asyncio.create_task(self._flushing(), name="corral-history-flush"),
                       asyncio.create_task(self._pruning(), name="corral-history-prune")]
        log.info("keeping the history of samples in %s (raw %g days, size bound %s)", self.path,
                 self.retention.raw_days, self.retention.max_bytes or "none")

    def _take_lock(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            self._lock = None
            raise HistoryInUse(f"history file {self.path} is in use by another process: give each controller replica "
                               "its own --identity (or --history-dir)") from None

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._declaring, return_exceptions=True)
        if self._history is not None:
            try:
                await self._history.close()  # writes what is still staged
            except Exception:
                log.exception("closing the history file %s failed; samples of the last %g s may be lost", self.path,
                              self.flush_s)
            self._history = None
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    # ---- in: on the event loop, no I/O ---------------------------------------------------------------------

    def record(self, device_id: str, contract: Contract | None, samples: Sequence[Sample], received_ms: float) -> None:
        """Stage the samples of the contract's sensors for the next batch."""
        if self._history is None or contract is None or not samples:
            return
        owner = self.owner(device_id)
        if owner is None:
            return
        sensors = {sensor.metric: sensor for sensor in contract.sensors}
        staged: list[HistorySample] = []
        for sample in samples:
            sensor = sensors.get(sample.metric)
            if sensor is None:
                continue
            key = SeriesKey(owner[0], owner[1], sample.metric)
            # Every sensor is kept as periodic: the contract has no word yet for a sensor that reports only its
            # changes (a bridged one), which the store would keep as a step.
            shape: Shape = (sensor.unit or None, False)
            if self._declared.get(key) != shape:
                self._declare(key, shape)
            staged.append(HistorySample(key, sample.ts, int(received_ms), sample.value))
        if staged:
            self._history.stage(staged)

    def _declare(self, key: SeriesKey, shape: Shape) -> None:
        """Declared in a batch on the writer thread. The batch's task is made before any flush that could carry
        these samples, and the writer runs its calls in order, so a series has its unit before its first rows."""
        self._declared[key] = shape
        if not self._pending:
            task = asyncio.get_running_loop().create_task(self._declare_pending())
            self._declaring.add(task)
            task.add_done_callback(self._declaring.discard)
        self._pending[key] = shape

    async def _declare_pending(self) -> None:
        batch, self._pending = self._pending, {}
        try:
            await self.history.declare_all(batch)
        except Exception:
            log.exception("declaring %d history series failed; they are kept without a unit", len(batch))
            metrics.HISTORY_FAILURES.labels(what="declare").inc()
            for key in batch:
                self._declared.pop(key, None)  # tried again with the next sample

    # ---- the tasks the controller owns ---------------------------------------------------------------------

    async def _flushing(self) -> None:
        while True:
            try:
                await self.history.flush_every(self.flush_s)
            except asyncio.CancelledError:
                raise
            except Exception:
                # A full disk, a damaged file: that batch is lost (the ring buffers still hold the last minutes);
                # the next ones are tried again.
                log.exception("writing a batch of samples to %s failed", self.path)
                metrics.HISTORY_FAILURES.labels(what="write").inc()

    async def _pruning(self) -> None:
        while True:
            try:
                deleted = await self.history.prune(int(time.time() * 1000))
                if deleted:
                    log.info("history retention dropped %d row(s) from %s", deleted, self.path)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("history retention on %s failed; tried again in %g s", self.path, self.prune_s)
                metrics.HISTORY_FAILURES.labels(what="prune").inc()
            await asyncio.sleep(self.prune_s)

    # ---- out: for the readings server -----------------------------------------------------------------------

    async def query(self, keys: Sequence[SeriesKey], start_ms: int, end_ms: int, **options: Any) -> dict[str, Any]:
        return await self.history.query(keys, start_ms, end_ms, **options)

"""The controller's history feed (reconcile/history.py) over a real SQLite file: what ingest stages is written in
batches with the contract's units, only the contract's sensors are kept, one writer per file, and the file name
a replica gets survives its restarts."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from corral.cli.run import _history_name as history_name
from corral.contract.model import Contract, Sensor
from corral.devices.messages import Sample
from corral.history.model import Retention, SeriesKey
from corral.history.store import HistoryStore
from corral.reconcile.history import HistoryFeed, HistoryInUse, history_file

# Near the wall clock: the feed runs retention at open, by the wall clock.
NOW = int(time.time() * 1000) - 120_000
CONTRACT = Contract(device_id="sensor-1", name="Climate", model="sht30", fw="1.0.0",
                    sensors=[Sensor(metric="temperature", unit="°C"), Sensor(metric="humidity", unit="%")])
OWNERS = {"sensor-1": ("home", "hall-climate")}


def feed(path: Path, flush_s: float = 3600.0) -> HistoryFeed:
    return HistoryFeed(path, Retention(), OWNERS.get, flush_s=flush_s)


def samples(metric: str, count: int, start: int = NOW) -> list[Sample]:
    return [Sample(metric=metric, value=20.0 + i / 10, ts=start + i * 1000) for i in range(count)]


def test_the_file_is_named_by_the_ordinal_else_the_identity_never_by_a_random_one() -> None:
    assert history_name("corral-controller-2", "corral-controller-2_ab12cd34") == "2"
    assert history_name(None, "replica-a") == "replica-a"
    assert history_name("", "we/ird id") == "we_ird_id"  # a file name, whatever the identity holds
    assert history_name("corral-controller-5f7b9c", None) == "controller"  # a Deployment's pod: no ordinal
    assert history_file("/var/lib/corral/history", "0") == Path("/var/lib/corral/history/history-0.sqlite3")


def test_staged_samples_are_written_in_batches_with_the_contracts_units(tmp_path: Path) -> None:
    path = tmp_path / "history-0.sqlite3"

    async def scenario() -> dict[str, Any]:
        history = feed(path, flush_s=0.05)
        await history.open()
        history.record("sensor-1", CONTRACT, samples("temperature", 30), NOW + 30_000)
        # Not a sensor of the contract (nor its device bound to a Device): kept in no series.
        history.record("sensor-1", CONTRACT, samples("invented", 5), NOW + 30_000)
        history.record("stranger", CONTRACT, samples("temperature", 5), NOW + 30_000)
        history.record("sensor-1", None, samples("humidity", 5), NOW + 30_000)

        async def written() -> None:
            while history.history.store.conn.execute("SELECT count(*) FROM raw").fetchone()[0] < 30:
                await asyncio.sleep(0.02)

        await asyncio.wait_for(written(), 10)  # the flush task wrote them, nobody asked
        answer = await history.query([SeriesKey("home", "hall-climate", "temperature")], NOW - 60_000, NOW + 60_000,
                                     period="raw", limit=1000)
        history.record("sensor-1", CONTRACT, samples("humidity", 3), NOW + 40_000)
        await history.close()  # writes what is still staged
        return answer

    answer = asyncio.run(scenario())
    series = answer["series"][0]
    assert series["unit"] == "°C" and series["found"] and len(series["points"]) == 30
    assert series["points"][0]["received_ms"] == NOW + 30_000
    store = HistoryStore(path)
    assert sorted((info.key.metric, info.unit) for info in store.all_series()) == [("humidity", "%"),
                                                                                   ("temperature", "°C")]
    assert store.conn.execute("SELECT count(*) FROM raw").fetchone()[0] == 33
    store.close()


def test_a_second_writer_of_the_same_file_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    path = tmp_path / "history-0.sqlite3"

    async def scenario() -> None:
        first = feed(path)
        await first.open()
        second = feed(path)
        with pytest.raises(HistoryInUse, match="give each controller replica its own --identity"):
            await second.open()
        await first.close()
        await second.open()
        await second.close()

    asyncio.run(scenario())

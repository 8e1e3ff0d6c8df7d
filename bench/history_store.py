"""History store: ingest rate, the CPU share of a 10,000-device fleet, a 24-hour 5-minute query, disk per device-day.

In this process, no plane: a fresh SQLite history file (corral.history.store.HistoryStore) in a temporary
directory fed as the controller would feed it: `--devices` devices of `--metrics` metrics (temperature and
humidity as floats, rssi as an int, ...) each sending a sample every `--every-s` seconds, spread evenly over the
interval, appended in one batch per `--batch-s` simulated seconds (what arrived meanwhile: 60 s, as
AsyncHistory.flush_every(60) stages them; 1 or 10 shows what smaller batches cost in bytes written), for
`--minutes` of simulated time. Only the append calls are timed (process CPU time and wall time), not the making of the samples.

Then one more device gets 24 hours of samples, and its 24-hour range is read at the 5-minute period (288 points,
limit 300, through a read-only connection as a reader thread would) `--query-runs` times, the answer's 32 KB
bound included (all five statistics of 288 buckets just fit; the line says so if the answer was thinned).

    .venv/bin/python bench/history_store.py [--devices 10000] [--metrics 3] [--every-s 10] [--minutes 5]
        [--batch-s 60] [--query-runs 30] [--dir DIR]

Prints samples/s on one core, the share of a core the issue's rate (devices x metrics / every-s samples a second,
30,000 / 10 s by default) would take, the query's p50/max in ms (goal <= 50 ms), and disk bytes per device-day
(the file after a checkpoint, rollups included, divided by device-days simulated), and the bytes written while
ingesting (write() calls: WAL appends and checkpoints, what wears an SD card) per sample and per second, and
how long retention takes to drop half the raw rows in its bounded steps (the longest step is how long an append
can wait behind it). Writes
bench/results/history_store-<time>.json.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common import percentile, write_result
from corral.history.model import DAY_MS, HistorySample, SeriesKey
from corral.history.store import HistoryReader, HistoryStore

METRICS = ("temperature", "humidity", "rssi", "pressure", "power", "voltage")
START = 1_800_000_000_000 - 1_800_000_000_000 % DAY_MS


def value(metric: str, rng: random.Random) -> float | int:
    if metric == "rssi":
        return rng.randint(-90, -40)
    return round(rng.gauss(21.0, 3.0), 2)


def written_bytes() -> int:
    """Bytes this process has passed to write() so far (WAL appends and checkpoints): what wears an SD card."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


def ingest(store: HistoryStore, args: argparse.Namespace) -> tuple[int, float, float]:
    """Feed the fleet; returns (samples, CPU seconds, wall seconds) of the appends alone."""
    rng = random.Random(42)
    metrics = METRICS[:args.metrics]
    keys = [[SeriesKey("factory", f"dev-{d:05d}", m) for m in metrics] for d in range(args.devices)]
    total, cpu, wall = 0, 0.0, 0.0
    for second in range(0, args.minutes * 60, args.batch_s):
        batch: list[HistorySample] = []
        for s in range(second, second + args.batch_s):
            now = START + s * 1000
            for d in range(s % args.every_s, args.devices, args.every_s):  # each device on its own phase
                batch.extend(HistorySample(key, now, now + 25, value(key.metric, rng)) for key in keys[d])
        c0, w0 = time.process_time(), time.perf_counter()
        store.append(batch)
        cpu += time.process_time() - c0
        wall += time.perf_counter() - w0
        total += len(batch)
    return total, cpu, wall


def query_24h(store: HistoryStore, path: Path, runs: int) -> tuple[list[float], dict[str, Any]]:
    """Give one device 24 hours of samples, then time its 24-hour 5-minute query on a reader connection."""
    key = SeriesKey("factory", "dev-query", "temperature")
    rng = random.Random(7)
    begin = START - DAY_MS
    for lo in range(0, DAY_MS, 3_600_000):
        store.append([HistorySample(key, begin + t, begin + t + 25, value("temperature", rng))
                      for t in range(lo, lo + 3_600_000, 10_000)])
    reader = HistoryReader(path)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        answer = reader.query([key], begin, begin + DAY_MS, period="5m", limit=300)
        times.append((time.perf_counter() - t0) * 1000)
    reader.close()
    return times, answer


def prune_half(store: HistoryStore, minutes: int) -> tuple[int, float, float, int]:
    """Retention as if the raw horizon had reached the middle of the simulated span: half the raw rows go.
    Returns (rows deleted, total seconds, the longest step in ms: how long an append could wait, steps)."""
    now = START + int(store.retention.raw_days * DAY_MS) + minutes * 30_000
    deleted, longest, steps = 0, 0.0, 0
    t0 = time.perf_counter()
    while True:
        s0 = time.perf_counter()
        report = store.prune(now)
        longest = max(longest, time.perf_counter() - s0)
        deleted, steps = deleted + report.deleted, steps + 1
        if report.done:
            break
    return deleted, time.perf_counter() - t0, longest * 1000, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--metrics", type=int, default=3, choices=range(1, len(METRICS) + 1))
    parser.add_argument("--every-s", type=int, default=10)
    parser.add_argument("--minutes", type=int, default=5, help="simulated minutes of fleet data")
    parser.add_argument("--batch-s", type=int, default=60,
                        help="seconds of arrivals per append batch (AsyncHistory.flush_every's interval)")
    parser.add_argument("--query-runs", type=int, default=30)
    parser.add_argument("--dir", type=Path, help="where the history file goes (default: a temporary directory)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "history.db"
        store = HistoryStore(path)
        w0 = written_bytes()
        samples, cpu, wall = ingest(store, args)
        written = written_bytes() - w0
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = store.file_bytes()
        times, answer = query_24h(store, path, args.query_runs)
        pruned, prune_s, prune_step_ms, prune_steps = prune_half(store, args.minutes)
        store.close()

    rate = samples / cpu
    need = args.devices * args.metrics / args.every_s
    device_days = args.devices * args.minutes / 1440
    result = {
        "devices": args.devices, "metrics": args.metrics, "every_s": args.every_s, "minutes": args.minutes,
        "batch_s": args.batch_s, "samples": samples, "append_cpu_s": round(cpu, 2), "append_wall_s": round(wall, 2),
        "samples_per_cpu_s": round(rate), "needed_samples_per_s": need, "core_share_pct": round(100 * need / rate, 1),
        "query_24h_5m_ms_p50": round(statistics.median(times), 2), "query_24h_5m_ms_p90": round(percentile(times, 0.9), 2),
        "query_24h_5m_ms_max": round(max(times), 2), "query_points": len(answer["series"][0]["points"]),
        "query_thinned": answer.get("thinned", False), "file_bytes": size,
        "bytes_per_device_day": round(size / device_days), "bytes_per_sample": round(size / samples, 1),
        "written_bytes": written, "written_per_sample": round(written / samples, 1),
        "written_mib_per_s_at_rate": round(written / samples * need / 2**20, 2),
        "prune_rows": pruned, "prune_s": round(prune_s, 2), "prune_longest_step_ms": round(prune_step_ms, 1),
        "prune_steps": prune_steps,
    }
    print(f"ingest: {samples:,} samples in {cpu:.2f} s CPU ({wall:.2f} s wall), {rate:,.0f} samples/s on one core")
    print(f"at {need:,.0f} samples/s ({args.devices:,} devices x {args.metrics} metrics / {args.every_s} s): "
          f"{result['core_share_pct']} % of a core (goal <= 15 %)")
    print(f"24-hour 5-minute query of one metric ({result['query_points']} points of 288"
          f"{', thinned to stay under 32 KB' if result['query_thinned'] else ''}): p50 {result['query_24h_5m_ms_p50']} ms, "
          f"p90 {result['query_24h_5m_ms_p90']} ms, max {result['query_24h_5m_ms_max']} ms (goal <= 50 ms)")
    print(f"disk: {size:,} bytes for {device_days:.2f} device-days: {result['bytes_per_device_day']:,} bytes per "
          f"device-day ({result['bytes_per_sample']} bytes per sample, rollups included)")
    print(f"written while ingesting: {written / 2**20:,.0f} MiB, {result['written_per_sample']} bytes per sample, "
          f"{result['written_mib_per_s_at_rate']} MiB/s at {need:,.0f} samples/s (WAL and checkpoints; "
          f"--batch-s {args.batch_s})")
    print(f"retention: {pruned:,} raw rows pruned in {prune_s:.2f} s, {prune_steps} bounded steps, the longest "
          f"{prune_step_ms:.0f} ms (what an append can wait behind it)")
    write_result("history_store", result)


if __name__ == "__main__":
    main()

"""History: a Device's samples over days and months, from the controller's store (`corral run --history-dir`).

    GET /apis/readings.corral.dev/v1alpha1/namespaces/NS/devices/NAME/history
        ?metric=a,b        the metrics (default: every sensor of the device's contract)
        &start=24h         relative ("30m", "24h", "7d"), ISO 8601 or epoch milliseconds (default 24h)
        &end=now           the same forms (default now)
        &period=5m         raw, 5m, hour or day
        &stats=mean,max    any of mean, min, max, last, count (default all)
        &limit=100         points per series, 1 to 1000
        &offset=0          with downsample=false: the first point of the page
        &downsample=true   false: exact points paged by offset instead of the whole range evenly
    Needs `listen` on the Device, as its readings do. The answer is the store's (corral.history.query), bounded to
    32 KB with the envelope, as a DeviceHistory.

Parameters are checked here, before the store is asked, so a mistake gets a 400 that names what is allowed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from corral.history.answers import MAX_ANSWER_BYTES, answer_bytes
from corral.history.model import SeriesKey
from corral.history.query import DEFAULT_LIMIT, MAX_LIMIT, PERIODS, STATS, QueryError
from corral.history.times import TimeSyntaxError, parse_range
from corral.serving.readings import GROUP, VERSION, BadQuery, DeviceSeen

DEFAULT_START = "24h"
# As many metrics as a device may have rings (devices.telemetry.MAX_METRICS): a query names no more.
MAX_METRICS = 32
PARAMETERS = ("metric", "start", "end", "period", "stats", "limit", "offset", "downsample")


class HistorySource(Protocol):
    """The controller's store (reconcile.history.HistoryFeed), handed in: serving imports nothing of reconcile/."""

    async def query(self, keys: Sequence[SeriesKey], start_ms: int, end_ms: int, **options: Any) -> dict[str, Any]: ...


@dataclass(frozen=True)
class HistoryQuery:
    metrics: tuple[str, ...] | None  # None: the contract's sensors
    start_ms: int
    end_ms: int
    period: str
    stats: tuple[str, ...]
    limit: int
    offset: int
    downsample: bool


def parse(query: Mapping[str, str], now_ms: int | None = None) -> HistoryQuery:
    """The query's parameters, or BadQuery saying what was wrong and what is allowed."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    unknown = sorted(set(query) - set(PARAMETERS))
    if unknown:
        raise BadQuery(f"unknown parameter(s) {', '.join(unknown)}: the parameters are {', '.join(PARAMETERS)}")
    metrics = tuple(dict.fromkeys(m.strip() for m in query.get("metric", "").split(",") if m.strip())) or None
    if metrics is not None and len(metrics) > MAX_METRICS:
        raise BadQuery(f"metric names {len(metrics)} metrics: at most {MAX_METRICS} in one query")
    try:
        start_ms, end_ms = parse_range(query.get("start") or DEFAULT_START, query.get("end") or None, now_ms)
    except TimeSyntaxError as err:
        raise BadQuery(f"start/end: {err}") from None
    period = query.get("period") or "5m"
    if period not in PERIODS:
        raise BadQuery(f"period={period!r}: use one of {', '.join(PERIODS)}")
    stats = tuple(s.strip() for s in (query.get("stats") or ",".join(STATS)).split(",") if s.strip())
    wrong = [s for s in stats if s not in STATS]
    if wrong or not stats:
        raise BadQuery(f"stats={query.get('stats')!r}: choose from {', '.join(STATS)} (comma-separated)")
    limit = _integer(query, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    offset = _integer(query, "offset", 0, 0, None)
    downsample = (query.get("downsample") or "true").lower()
    if downsample not in ("true", "false"):
        raise BadQuery(f"downsample={query.get('downsample')!r}: true or false")
    return HistoryQuery(metrics, start_ms, end_ms, period, stats, limit, offset, downsample == "true")


def _integer(query: Mapping[str, str], name: str, default: int, low: int, high: int | None) -> int:
    text = query.get(name)
    if text is None or text == "":
        return default
    allowed = f"a whole number from {low} to {high}" if high is not None else f"a whole number from {low}"
    try:
        value = int(text)
    except ValueError:
        raise BadQuery(f"{name}={text!r}: give {allowed}") from None
    if value < low or (high is not None and value > high):
        raise BadQuery(f"{name}={text!r}: give {allowed}")
    return value


def metrics_of(asked: HistoryQuery, view: DeviceSeen) -> tuple[str, ...]:
    """The metrics asked for, else the contract's sensors; BadQuery when neither names any."""
    if asked.metrics is not None:
        return asked.metrics
    if view.contract is not None and view.contract.sensors:
        return tuple(sensor.metric for sensor in view.contract.sensors)
    raise BadQuery("give metric=NAME[,NAME]: the device has announced no contract with sensors since the controller "
                   "started, so there are no default metrics")


async def history(source: HistorySource, namespace: str, name: str, view: DeviceSeen,
                  asked: HistoryQuery) -> dict[str, Any]:
    """The DeviceHistory document: the store's answer in an envelope, under MAX_ANSWER_BYTES in all."""
    metrics = metrics_of(asked, view)
    envelope: dict[str, Any] = {"kind": "DeviceHistory", "apiVersion": f"{GROUP}/{VERSION}",
                                "metadata": {"name": name, "namespace": namespace}, "deviceId": view.device_id}
    keys = [SeriesKey(namespace, name, metric) for metric in metrics]
    try:
        answer = await source.query(keys, asked.start_ms, asked.end_ms, period=asked.period, stats=asked.stats,
                                    limit=asked.limit, offset=asked.offset, downsample=asked.downsample,
                                    max_bytes=MAX_ANSWER_BYTES - answer_bytes(envelope) - 16)
    except QueryError as err:
        raise BadQuery(str(err)) from None
    return {**envelope, **answer}

"""The history route's parameters (serving/history.py): defaults, and a 400's words naming what is allowed."""

from __future__ import annotations

import pytest

from corral.contract.model import Contract, Sensor
from corral.history.model import HOUR_MS
from corral.serving.history import HistoryQuery, metrics_of, parse
from corral.serving.readings import BadQuery

NOW = 1_796_000_000_000


class Seen:
    device_id: str | None = "sensor-1"
    exists = True
    online = True

    def __init__(self, contract: Contract | None) -> None:
        self.contract = contract


def test_defaults_are_the_last_day_in_5_minute_buckets_of_every_stat() -> None:
    asked = parse({}, NOW)
    assert asked == HistoryQuery(None, NOW - 24 * HOUR_MS, NOW, "5m", ("mean", "min", "max", "last", "count"), 100,
                                 0, True)
    asked = parse({"metric": "temperature, humidity,temperature", "start": "2h", "end": "1h", "period": "raw",
                   "stats": "max,last", "limit": "1000", "offset": "5", "downsample": "false"}, NOW)
    assert asked == HistoryQuery(("temperature", "humidity"), NOW - 2 * HOUR_MS, NOW - HOUR_MS, "raw",
                                 ("max", "last"), 1000, 5, False)


@pytest.mark.parametrize(("query", "said"), [
    ({"period": "minute"}, "period='minute': use one of raw, 5m, hour, day"),
    ({"stats": "median"}, "choose from mean, min, max, last, count"),
    ({"limit": "0"}, "limit='0': give a whole number from 1 to 1000"),
    ({"limit": "5000"}, "from 1 to 1000"),
    ({"limit": "ten"}, "limit='ten': give a whole number"),
    ({"offset": "-1"}, "offset='-1': give a whole number from 0"),
    ({"start": "yesterday"}, "start/end: 'yesterday' is not a time"),
    ({"start": "3x"}, "the units are s, m, h, d and w"),
    ({"start": "1h", "end": "2h"}, "must come after the start"),
    ({"downsample": "maybe"}, "true or false"),
    ({"metrics": "temperature"}, "unknown parameter(s) metrics: the parameters are metric, start"),
    ({"metric": ",".join(f"m{i}" for i in range(40))}, "at most 32"),
])
def test_a_bad_parameter_is_refused_naming_what_is_allowed(query: dict[str, str], said: str) -> None:
    with pytest.raises(BadQuery) as refused:
        parse(query, NOW)
    assert said in str(refused.value)


def test_the_metrics_default_to_the_contracts_sensors() -> None:
    contract = Contract(device_id="sensor-1", name="Climate", model="sht30", fw="1.0.0",
                        sensors=[Sensor(metric="temperature"), Sensor(metric="humidity")])
    assert metrics_of(parse({}, NOW), Seen(contract)) == ("temperature", "humidity")
    assert metrics_of(parse({"metric": "humidity"}, NOW), Seen(None)) == ("humidity",)
    with pytest.raises(BadQuery, match="give metric=NAME"):
        metrics_of(parse({}, NOW), Seen(None))

"""iot.control's `wait_for_fresh_s`: cite the sensor's newest sample when the one cited has been overtaken.

An agent reads a sample, thinks, and cites it; by then the sample may be a publish interval or two old, and
the controller refuses a citation older than its limit (DENY_SENSOR, contract.freshness). A caller that asks
for it (wait_for_fresh_s, at most MAX_WAIT_S) gets this instead, per citation, before the Intent is made:

- a newer sample of that sensor has arrived: the newest is cited instead (a fresher reading of the same
  sensor is never weaker evidence);
- the cited sample is the newest, and younger than the publish interval its contract declares: cited as is;
- it is the newest but its successor is due (older than the interval): the gateway waits, up to the seconds
  asked for all citations together, for a newer sample and cites that; none came: cited as is, and the
  controller decides (its refusal names the limit and when the next sample is due).

The answer lists what was cited (`cited`, with each value), so the agent sees the evidence its request rests
on. Only samples the caller may read (`listen`) are looked at, with the caller's own identity.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from corral.gateway.visible import VisibleDevice

MAX_WAIT_S = 10.0
POLL_S = 0.25

# The newest sample of a device's metric as iot.read shows it ({ts, value, age_s}), or None.
Latest = Callable[[VisibleDevice, str], Awaitable[dict[str, Any] | None]]

SCHEMA = {
    "type": "number", "minimum": 0, "maximum": MAX_WAIT_S,
    "description": "Seconds (at most 10) to wait for a fresher reading when a based_on sample has been overtaken: "
                   "a newer sample of that sensor is cited instead, and one whose next sample is due (older than "
                   "its publish interval) is replaced by the next one if it arrives in time. The answer's cited "
                   "lists what was cited. Default 0: cite exactly what based_on says.",
}


class WaitError(ValueError):
    pass


def wait_of(arguments: dict[str, Any]) -> float:
    """The wait asked for, in seconds; WaitError says what is allowed."""
    wait = arguments.get("wait_for_fresh_s", 0)
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= MAX_WAIT_S:
        raise WaitError(f"wait_for_fresh_s must be a number of seconds from 0 to {MAX_WAIT_S:g}, not {wait!r}.")
    return float(wait)


async def freshen(based_on: Sequence[dict[str, Any]], acted: VisibleDevice,
                  by_mqtt_id: Callable[[str], VisibleDevice | None], latest: Latest, wait_s: float,
                  clock: Callable[[], float] = time.monotonic) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The Intent's basedOn with overtaken samples replaced, and what was cited (metric, ts, value, device)."""
    deadline = clock() + wait_s
    spec_items: list[dict[str, Any]] = []
    cited: list[dict[str, Any]] = []
    for item in based_on:
        device = by_mqtt_id(item["deviceId"]) if item.get("deviceId") else acted
        sample = None
        if device is not None and "listen" in device.levels:
            sample = await _newest_after(device, item["metric"], item["ts"], latest, deadline, clock)
        chosen = {**item, "ts": sample["ts"]} if sample is not None else dict(item)
        spec_items.append(chosen)
        cited.append({"device_id": device.id if device is not None else item.get("deviceId"), "metric": item["metric"],
                      "ts": chosen["ts"], **({"value": sample["value"]} if sample is not None else {}),
                      "replaced": sample is not None and sample["ts"] != item["ts"]})
    return spec_items, cited


async def _newest_after(device: VisibleDevice, metric: str, ts: int, latest: Latest, deadline: float,
                        clock: Callable[[], float]) -> dict[str, Any] | None:
    """The sample to cite for (metric, ts): a newer one if there is or comes one in time, else the cited one's
    own reading when it is the newest (None when the sensor has none to show)."""
    sensor = next((s for s in device.contract.sensors if s.metric == metric), None) if device.contract else None
    interval = sensor.interval_s if sensor is not None else None
    while True:
        newest = await latest(device, metric)
        if newest is None:
            return None
        if newest["ts"] > ts:
            return newest
        due = interval is not None and newest["ts"] == ts and float(newest.get("age_s") or 0) >= interval
        if not due or clock() >= deadline:
            return newest if newest["ts"] == ts else None
        await asyncio.sleep(min(POLL_S, max(0.0, deadline - clock())))

"""What an Intent's citations (`based_on`) must be: samples the controller received, recently enough. Pure.

The controller gathers the `Evidence` from its reading buffers; `citation_problem` judges the citations against it
and the freshness rule (contract.freshness), and says, when one fails, what the agent could cite instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from corral.contract.freshness import FACTOR, FreshnessRule
from corral.contract.model import Contract
from corral.contract.values import shown


@dataclass(frozen=True)
class Observation:
    metric: str
    ts_ms: int  # the device's ts of the cited sample
    device_id: str | None = None


@dataclass(frozen=True)
class Received:
    """A sample as the controller received it: the device's ts (what is cited) and the controller's receive time."""

    ts: int
    received_ms: float
    value: object = None


@dataclass(frozen=True)
class Evidence:
    """What the controller's reading buffers hold for an Intent's citations, gathered by the controller.

    `cited` maps (device id, metric, ts) to the first arrival of that very sample; `freshest` maps (device id,
    metric) to the newest sample received. The buffers live in memory: nothing received before `since` (the
    controller's start) can be matched. `intervals` maps (device id, metric) to the publish interval the trusted
    contract declares, `overrides` to a person's limit on the Device (spec.freshness), both in seconds.
    """

    cited: Mapping[tuple[str, str, int], Received] = field(default_factory=dict)
    freshest: Mapping[tuple[str, str], Received] = field(default_factory=dict)
    since: datetime | None = None
    intervals: Mapping[tuple[str, str], float] = field(default_factory=dict)
    overrides: Mapping[tuple[str, str], float] = field(default_factory=dict)




NO_EVIDENCE = Evidence()  # nothing received: every citation fails

def citation_problem(based_on: Sequence[Observation], default_source: str, device_id: str | None, contract: Contract,
                     evidence: Evidence, rule: FreshnessRule, now: datetime) -> str | None:
    """Every cited reading must be a sample the controller received (same device ts), received recently enough
    by the controller's own clock (its sensor's limit, contract.freshness); the message names the limit, the
    freshest sample the agent could have cited instead and when the next one is due. None: every citation holds."""
    now_ms = now.timestamp() * 1000
    metrics = {s.metric for s in contract.sensors}
    for obs in based_on:
        source = obs.device_id or default_source
        label = f"{source}/{obs.metric}"
        if not isinstance(obs.ts_ms, int) or isinstance(obs.ts_ms, bool):
            return f"Observation {label} has no valid timestamp (ts must be Unix epoch milliseconds, an integer)."
        if source == device_id and obs.metric not in metrics:
            return f"Observation {label}: the device has no sensor {obs.metric!r} (sensors: {', '.join(sorted(metrics))})."
        cited = evidence.cited.get((source, obs.metric, obs.ts_ms))
        if cited is None:
            return (f"Observation {label} at ts={obs.ts_ms} is not a sample the controller received. "
                    + _freshest(evidence, source, obs.metric, now_ms))
        key = (source, obs.metric)
        interval, override = evidence.intervals.get(key), evidence.overrides.get(key)
        limit_s = rule.limit_s(interval, override)
        age_s = (now_ms - cited.received_ms) / 1000
        if age_s > limit_s:
            return (f"Observation {label} at ts={obs.ts_ms} was received {age_s:.1f} s ago; decisions may rely only on "
                    f"readings of {label} received within {limit_s:g} s ({_limit_origin(rule, interval, override)}). "
                    + _freshest(evidence, source, obs.metric, now_ms, obs.ts_ms))
    return None


def _limit_origin(rule: FreshnessRule, interval: float | None, override: float | None) -> str:
    if override is not None:
        return "set for this Device by a person, spec.freshness"
    if interval is None:
        return "the cluster's default: its contract declares no publish interval"
    if rule.limit_s(interval) < FACTOR * interval:
        return f"the cluster's cap; its contract declares a sample every {interval:g} s"
    return f"{FACTOR:g} x the {interval:g} s publish interval its contract declares"


def _freshest(evidence: Evidence, source: str, metric: str, now_ms: float, cited_ts: int | None = None) -> str:
    newest = evidence.freshest.get((source, metric))
    if newest is None:
        since = f" since the controller started at {evidence.since:%H:%M:%S} UTC" if evidence.since else ""
        return (f"No sample of {source}/{metric} has arrived{since} (readings are kept in memory, so a restarted "
                "controller has none until the device sends again); wait for a new reading (iot.read) and cite it.")
    age = f"{(now_ms - newest.received_ms) / 1000:.1f} s ago"
    interval = evidence.intervals.get((source, metric))
    if interval is None:
        due = "The device declares no publish interval, so when the next one comes is unknown"
    else:
        due_ms = newest.received_ms + interval * 1000
        when = datetime.fromtimestamp(due_ms / 1000, UTC)
        delta = (due_ms - now_ms) / 1000
        due = (f"The next sample is due at {when:%H:%M:%S}.{when.microsecond // 100000} UTC "
               + (f"(in {delta:.1f} s)" if delta >= 0 else f"({-delta:.1f} s ago, so it is late)"))
    if newest.ts == cited_ts:
        return (f"It is the freshest sample the controller has (value {shown(newest.value)}, received {age}). {due}; "
                "read again (iot.read) once it has arrived and cite it, or ask iot.control to wait for it "
                "(wait_for_fresh_s).")
    return (f"The freshest sample the controller has is ts={newest.ts} (value {shown(newest.value)}, received {age}). "
            f"{due}; read again (iot.read) and cite a fresh one.")

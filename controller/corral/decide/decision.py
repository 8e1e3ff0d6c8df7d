"""Deciding one Intent: pure, no I/O, fed with everything the decision depends on.

The controller gathers the facts (the contract, the device's online state, the
SubjectAccessReview answers, the approvals, the clock) and calls `decide()`,
which applies the checks in a fixed order and returns exactly one outcome:
execute, wait for a human, or a final code with a message a person (or a
model) can act on. Keeping it pure is what lets every path be unit-tested,
property-tested, and read in one place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from corral.contract.model import Contract, Risk
from corral.contract.values import InvalidValue, Value, check
from corral.decide.approvals import ApprovalView, judge_approvals

Outcome = Literal["execute", "await_approval", "final"]
Code = Literal[
    "EXECUTED", "DEDUP", "DENY_ID_CONFLICT", "DENY_UNKNOWN_ACTION", "DENY_ARGUMENTS", "DENY_SCOPE", "DENY_SENSOR",
    "DENY_APPROVAL", "DENIED_BY_APPROVER", "DEVICE_GONE", "TIMEOUT", "FAILED",
]


@dataclass(frozen=True)
class Policy:
    """Chart values: how many approvals each risk needs, and the time limits."""

    approvals_required: dict[str, int] = field(
        default_factory=lambda: {"low": 0, "medium": 1, "high": 1, "critical": 1}
    )
    freshness: timedelta = timedelta(seconds=2)
    # How long a request may wait for a human, and how long an approval is good for.
    approval_window: timedelta = timedelta(minutes=5)


@dataclass(frozen=True)
class Observation:
    metric: str
    ts_ms: float
    device_id: str | None = None


@dataclass(frozen=True)
class IntentFacts:
    """What was asked (the Intent's spec) and when."""

    uid: str
    name: str
    device: str
    actuator: str
    action: str
    value: object
    requester: str
    created_at: datetime
    based_on: tuple[Observation, ...] = ()


@dataclass(frozen=True)
class DeviceFacts:
    exists: bool
    device_id: str | None
    contract: Contract | None
    online: bool | None


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    code: Code | None
    message: str
    risk: Risk | None = None
    level: str | None = None
    value: Value | None = None  # the checked value, in its canonical type, when it executes
    approvals: tuple[str, ...] = ()  # names of the approvals this execution consumes
    expires_at: datetime | None = None  # while awaiting approval


def decide(
    intent: IntentFacts,
    device: DeviceFacts,
    requester_may: bool,
    approvals: list[ApprovalView],
    params_hash: str,
    now: datetime,
    policy: Policy = Policy(),
) -> Decision:
    """One Intent, one outcome. Checks run in a fixed order; the first that fails decides."""
    if not device.exists or device.contract is None:
        # Without a contract nothing can be checked: the device is not there for us.
        where = "does not exist" if not device.exists else "has no accepted contract"
        return _final("DEVICE_GONE", f"Device {intent.device} {where}; nothing was sent.")
    contract = device.contract
    if intent.action == "read":
        return _decide_read(intent, device, contract, requester_may, now, policy)

    actuator = contract.actuator(intent.actuator)
    if actuator is None or actuator.action != intent.action:
        offered = "; ".join(f"{a.id}: {a.action}" for a in contract.actuators) or "none"
        if actuator is None:
            what = f"Device {intent.device} has no actuator {intent.actuator!r}"
        else:
            what = f"actuator {intent.actuator!r} is set with {actuator.action}, not {intent.action}"
        return _final("DENY_UNKNOWN_ACTION", f"{what}. Actions it offers: {offered}.")

    try:
        value = check(actuator, intent.value)
    except InvalidValue as err:
        return _final("DENY_ARGUMENTS", f"Invalid value: {err}.", actuator.risk, actuator.level)

    if not requester_may:
        return _final(
            "DENY_SCOPE",
            f"{intent.requester} may not {actuator.level} device {intent.device}: the action needs the "
            f"'{actuator.level}' verb on devices/{intent.device} (corral.dev), which Kubernetes RBAC does not grant.",
            actuator.risk, actuator.level,
        )

    sensor_problem = _check_observations(intent, device, contract, now, policy)
    if sensor_problem is not None:
        return _final("DENY_SENSOR", sensor_problem, actuator.risk, actuator.level)

    consumed: tuple[str, ...] = ()
    needed = policy.approvals_required.get(actuator.risk, 1)
    if needed > 0:
        verdict = judge_approvals(approvals, intent.uid, params_hash, intent.requester, needed, now, policy.approval_window)
        if verdict.state == "denied":
            return _final("DENIED_BY_APPROVER", verdict.message, actuator.risk, actuator.level)
        if verdict.state == "invalid":
            return _final("DENY_APPROVAL", verdict.message, actuator.risk, actuator.level)
        if verdict.state == "pending":
            expires_at = intent.created_at + policy.approval_window
            if now >= expires_at:
                return _final(
                    "DENY_APPROVAL",
                    f"No approval arrived within {_duration(policy.approval_window)} of the request; it expired.",
                    actuator.risk, actuator.level,
                )
            return Decision(
                "await_approval", None,
                f"Risk {actuator.risk}: waiting for {needed} approval(s) by someone other than {intent.requester} "
                f"until {expires_at:%H:%M:%S} UTC (corral approve {intent.name}).",
                actuator.risk, actuator.level, value, expires_at=expires_at,
            )
        consumed = verdict.approvals

    if not device.online:
        return _final("DEVICE_GONE", f"Device {intent.device} is offline; nothing was sent.", actuator.risk, actuator.level)

    return Decision("execute", None, "Checks passed.", actuator.risk, actuator.level, value, approvals=consumed)


def _decide_read(
    intent: IntentFacts, device: DeviceFacts, contract: Contract, requester_may: bool, now: datetime, policy: Policy
) -> Decision:
    """A fresh read changes nothing on the device: it needs the read verb and an online device, no approval."""
    readable = [a.id for a in contract.actuators] + [s.metric for s in contract.sensors]
    if intent.actuator not in readable:
        return _final("DENY_UNKNOWN_ACTION",
                      f"Device {intent.device} has nothing named {intent.actuator!r} to read. "
                      f"Readable: {', '.join(readable) or 'nothing'}.")
    if not requester_may:
        return _final("DENY_SCOPE", f"{intent.requester} may not read device {intent.device}: reading needs the "
                      f"'read' verb on devices/{intent.device} (corral.dev).", "low", "read")
    sensor_problem = _check_observations(intent, device, contract, now, policy)
    if sensor_problem is not None:
        return _final("DENY_SENSOR", sensor_problem, "low", "read")
    if not device.online:
        return _final("DEVICE_GONE", f"Device {intent.device} is offline; it cannot be read now.", "low", "read")
    return Decision("execute", None, "Checks passed.", "low", "read")


def _check_observations(
    intent: IntentFacts, device: DeviceFacts, contract: Contract, now: datetime, policy: Policy
) -> str | None:
    now_ms = now.timestamp() * 1000
    metrics = {s.metric for s in contract.sensors}
    for obs in intent.based_on:
        label = f"{obs.device_id or device.device_id}/{obs.metric}"
        if not isinstance(obs.ts_ms, (int, float)) or isinstance(obs.ts_ms, bool) or not math.isfinite(obs.ts_ms):
            return f"Observation {label} has no valid timestamp (ts must be Unix epoch milliseconds)."
        if obs.ts_ms > now_ms + 1000:  # a second of clock skew is tolerated
            return f"Observation {label} is from the future ({obs.ts_ms:.0f} > now {now_ms:.0f}); query again."
        if (obs.device_id is None or obs.device_id == device.device_id) and obs.metric not in metrics:
            return f"Observation {label}: the device has no sensor {obs.metric!r} (sensors: {', '.join(sorted(metrics))})."
        age_s = (now_ms - obs.ts_ms) / 1000
        if age_s > policy.freshness.total_seconds():
            return (
                f"Observation {label} is {age_s:.1f} s old; decisions may rely only on readings younger than "
                f"{policy.freshness.total_seconds():g} s. Query the device again and retry."
            )
    return None


def _final(code: Code, message: str, risk: Risk | None = None, level: str | None = None) -> Decision:
    return Decision("final", code, message, risk, level)


def _duration(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds < 120:
        return f"{seconds:g} seconds"
    return f"{seconds / 60:g} minutes"

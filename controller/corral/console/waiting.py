"""What the page shows: the Intents waiting for a person, each with the context needed to decide.

Built from API objects as they come from the API server (the person's own reads), so it is pure and
unit-tested: an Intent, the Device it acts on (None when the person may not read it), and whether the
person holds `approve` on that Device.

What the card leads with is what the Device is, as enrolled: its name and type. An alias and a location are
what a person or an agent called it (an agent can set them, so "kitchen-light" could be the front door's lock):
they come second and say so. Everything people, agents and devices wrote (reason, alias, location, messages)
is made safe before it is shown: no control, bidi, zero-width or tag characters, and cut to its length.
The change, the people and the outcome are also said in words (words.py), the exact form kept beside them.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Final

from corral.api.codes import PEOPLE_NAMESPACE
from corral.api.durations import seconds_of
from corral.api.pause import paused_of
from corral.client.enroll import DEVICE_TYPE_LABEL
from corral.client.intents import outcome_code
from corral.console.words import (
    Hold,
    change_words,
    confirmation,
    hold_text,
    outcome_words,
    said_of,
    then_words,
    who,
)
from corral.contract.text import REASON_LIMIT, written_text

WAITING: Final = "AwaitingApproval"
OVERLAY_CHANGES: Final = {"set_alias": "alias", "set_note": "notes", "set_location": "location"}
OVERLAY_TEXT: Final = 64  # the overlay's own limit (api.device.Overlay)
MESSAGE_TEXT: Final = 1024  # an Intent's status.message

DeviceKey = tuple[str, str]  # (namespace, device name)


@dataclass(frozen=True)
class Reading:
    """A sample the requester cites: metric, the device's ts (epoch ms) and that time in UTC."""

    metric: str
    ts: int
    at: str
    device: str


@dataclass(frozen=True)
class IntentView:
    namespace: str
    name: str
    uid: str
    device: str
    device_type: str  # the type it was enrolled as (label corral.dev/device-type); "" when unknown or unreadable
    title: str  # what the card leads with: the Device's name and type, e.g. "front-lock (lock)"
    alias: str
    location: str
    named: str  # the alias and location, marked as what a person or agent called it; "" when there are none
    actuator: str
    action: str
    change: str  # e.g. `locked = true`
    # The contract's words (the device's, shown marked so; "" when the contract is unknown or unreadable):
    change_words: str  # e.g. "Bolt → bolt thrown (locked)"
    # A timed hold is part of the change a person approves: what is put back after it, and when ("" without one).
    hold: str  # e.g. `locked = false after 8 s`, or `the value from before after 20 min`
    then_words: str  # `then` in the contract's words, e.g. "Bolt → unlocked"
    device_kind: str  # the contract's product name, e.g. "Door lock"
    contract_says: str  # the actuator's description, e.g. "true = bolt thrown (locked), false = unlocked. ..."
    current: str | None  # the device's reported state of that actuator, e.g. `locked = false`; None: unknown
    current_words: str  # that state in the contract's words, e.g. "Bolt → unlocked"
    current_note: str  # e.g. "last known: the device is offline"
    risk: str
    requester: str  # the exact username
    requester_name: str  # as people and agents are named: "alice", "agent in home"
    requester_kind: str  # person, agent or system
    reason: str
    based_on: tuple[Reading, ...]
    created: str
    expires_at: str | None
    seconds_left: float | None
    phase: str
    outcome: str  # EXECUTED, DENIED_BY_APPROVER, ..., AWAITING_APPROVAL or PENDING
    outcome_words: str  # the outcome in a sentence: "Done: Bolt → unlocked.", "Denied by alice: not now."
    message: str
    approval: str
    waiting: bool
    may_approve: bool
    confirm: str  # the question a high- or critical-risk approval asks before it is sent; "" for lower risks

    def as_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["based_on"] = [asdict(r) for r in self.based_on]
        return document


def shown(value: Any) -> str:
    """A target value as people write it in the CLI: JSON (true, 21.5, "auto")."""
    return json.dumps(value, ensure_ascii=False)


def parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def _title(device: str, device_type: str) -> str:
    return f"{device} ({device_type})" if device_type else device


def _named(alias: str, location: str) -> str:
    """The overlay, second and marked: it is what someone called the device, not what the device is."""
    said = [f"called “{alias}”"] if alias else []
    said += [f"said to be in “{location}”"] if location else []
    return f"{' and '.join(said)} by a person or agent" if said else ""


def change_of(spec: Mapping[str, Any]) -> str:
    actuator, action = _text(spec.get("actuator")), _text(spec.get("action"))
    value = (spec.get("params") or {}).get("value")
    if action == "read":
        return f"read {actuator}"
    if action in OVERLAY_CHANGES:
        return f"set the {OVERLAY_CHANGES[action]} to {shown(value)}"
    return f"{actuator} = {shown(value)}"


def hold_of(spec: Mapping[str, Any]) -> Hold | None:
    """The Intent's timed hold (holdFor, and then if given); None without one, or with a holdFor that is not a
    duration (the API server refuses those)."""
    hold_for = spec.get("holdFor")
    if not isinstance(hold_for, str):
        return None
    try:
        seconds = seconds_of(hold_for)
    except ValueError:
        return None
    then = spec.get("then")
    has_then = isinstance(then, Mapping) and "value" in then
    return Hold(seconds, then.get("value") if isinstance(then, Mapping) else None, has_then)


def _reported(device: Mapping[str, Any] | None, actuator: str) -> tuple[bool, Any]:
    reported = ((device or {}).get("status") or {}).get("reported") or {}
    return (True, reported[actuator]) if actuator in reported else (False, None)


def _current(device: Mapping[str, Any] | None, actuator: str) -> tuple[str | None, str]:
    if device is None:
        return None, "you may not read this device"
    status = device.get("status") or {}
    known, value = _reported(device, actuator)
    if not known:
        return None, "not reported yet"
    note = "last known: the device is offline" if status.get("online") is False or status.get("stale") else ""
    return f"{actuator} = {shown(value)}", note


def _readings(spec: Mapping[str, Any]) -> tuple[Reading, ...]:
    out = []
    for item in spec.get("basedOn") or []:
        ts = item.get("ts")
        if not isinstance(ts, int) or isinstance(ts, bool):
            continue
        try:
            at = datetime.fromtimestamp(ts / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        except (OverflowError, OSError, ValueError):
            at = ""
        out.append(Reading(_text(item.get("metric")), ts, at, _text(item.get("deviceId")) or _text(spec.get("device"))))
    return tuple(out)


def intent_view(intent: Mapping[str, Any], device: Mapping[str, Any] | None, may_approve: bool,
                now: datetime, contract: Mapping[str, Any] | None = None,
                people_namespace: str = PEOPLE_NAMESPACE) -> IntentView:
    """One Intent as the page shows it (waiting or decided). contract: the spec of the Capability the controller
    trusts for the Device (None: unknown or unreadable), for the change in the contract's own words."""
    metadata, spec, status = intent.get("metadata") or {}, intent.get("spec") or {}, intent.get("status") or {}
    overlay = ((device or {}).get("spec") or {}).get("overlay") or {}
    labels = ((device or {}).get("metadata") or {}).get("labels") or {}
    name, device_type = written_text(spec.get("device"), 253), written_text(labels.get(DEVICE_TYPE_LABEL), 63)
    alias, location = written_text(overlay.get("alias"), OVERLAY_TEXT), written_text(overlay.get("location"), OVERLAY_TEXT)
    actuator = _text(spec.get("actuator"))
    current, note = _current(device, actuator)
    expires = parse_time(status.get("approvalExpiresAt"))
    waiting = status.get("phase") == WAITING
    said = said_of(contract, actuator) if _text(spec.get("action")) not in OVERLAY_CHANGES else None
    value, hold = (spec.get("params") or {}).get("value"), hold_of(spec)
    known, reported = _reported(device, actuator)
    asker, phase, risk = who(_text(spec.get("requester")), people_namespace), _text(status.get("phase")), \
        _text(status.get("risk")) or "unknown"
    message, code = written_text(status.get("message"), MESSAGE_TEXT), outcome_code(status)
    after = status.get("after") if isinstance(status.get("after"), Mapping) else None
    return IntentView(
        namespace=_text(metadata.get("namespace")),
        name=_text(metadata.get("name")),
        uid=_text(metadata.get("uid")),
        device=name,
        device_type=device_type,
        title=_title(name, device_type),
        alias=alias,
        location=location,
        named=_named(alias, location),
        actuator=actuator,
        action=_text(spec.get("action")),
        change=change_of(spec),
        change_words=change_words(said, value),
        hold=hold_text(actuator, hold), then_words=then_words(said, hold),
        device_kind=said.device_kind if said else "",
        contract_says=said.about if said else "",
        current=current,
        current_note=note,
        current_words=change_words(said, reported) if known else "",
        risk=risk,
        requester=_text(spec.get("requester")),
        requester_name=asker.name,
        requester_kind=asker.kind,
        reason=written_text(spec.get("reason"), REASON_LIMIT),
        based_on=_readings(spec),
        created=_text(metadata.get("creationTimestamp")),
        expires_at=expires.isoformat().replace("+00:00", "Z") if expires else None,
        seconds_left=max(0.0, round((expires - now).total_seconds(), 1)) if expires and waiting else None,
        phase=phase or "Pending",
        outcome=code,
        outcome_words=outcome_words(code, phase, message, said, value, after, actuator,
                                    written_text(status.get("deviceError"), MESSAGE_TEXT), people_namespace),
        message=message,
        approval=_text(status.get("approval")),
        waiting=waiting,
        may_approve=waiting and may_approve,
        confirm=confirmation(risk, _title(name, device_type), said, actuator, value, hold),
    )


def paused_notices(switches: Iterable[Mapping[str, Any]], served: Collection[str] | None) -> list[dict[str, str]]:
    """The page's banner: one sentence for each namespace it serves where agents are paused (their AgentPauses as
    the person reads them), in namespace order."""
    notices = []
    for body in switches:
        paused = paused_of(body)
        if paused is not None and (served is None or paused.namespace in served):
            notices.append({"namespace": paused.namespace, "by": paused.by, "reason": paused.reason,
                            "message": f"{paused.sentence()} {paused.resume_hint()} Your own requests still run."})
    return sorted(notices, key=lambda n: n["namespace"])


def waiting_devices(intents: Iterable[Mapping[str, Any]]) -> set[DeviceKey]:
    """The Devices of the Intents that wait for approval: the ones to read and to check `approve` on."""
    return {(_text(i["metadata"].get("namespace")), _text(i["spec"].get("device")))
            for i in intents if (i.get("status") or {}).get("phase") == WAITING and not i["spec"].get("dryRun")}


def waiting_for(intents: Iterable[Mapping[str, Any]], devices: Mapping[DeviceKey, Mapping[str, Any] | None],
                approvable: Collection[DeviceKey], now: datetime,
                contracts: Mapping[DeviceKey, Mapping[str, Any] | None] | None = None,
                people_namespace: str = PEOPLE_NAMESPACE) -> list[IntentView]:
    """The Intents waiting for this person: awaiting approval, on a Device where they hold `approve`; the
    one that expires first comes first. contracts: each Device's trusted contract (Capability spec), if read."""
    views = []
    for intent in intents:
        if (intent.get("status") or {}).get("phase") != WAITING or (intent.get("spec") or {}).get("dryRun"):
            continue
        key = (_text(intent["metadata"].get("namespace")), _text(intent["spec"].get("device")))
        if key not in approvable:
            continue
        views.append(intent_view(intent, devices.get(key), True, now, (contracts or {}).get(key), people_namespace))
    far = datetime.max.replace(tzinfo=UTC).isoformat()
    return sorted(views, key=lambda v: (v.expires_at or far, v.created, v.namespace, v.name))

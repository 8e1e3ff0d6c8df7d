"""Parsing what devices send. Every payload is untrusted: size-capped, strict JSON, bounded shapes.

Each parser returns a typed message or raises BadMessage with a sentence that
can go into an Event or a log line as it is.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

from corral.contract.model import IDENTIFIER_PATTERN, Contract
from corral.contract.text import bounded

MAX_PAYLOAD_BYTES = 64 * 1024
MAX_DEPTH = 16

Kind = Literal["info", "status", "cmd", "ack", "telemetry", "event"]
StateValue = bool | int | float | str


class BadMessage(ValueError):
    """A device sent something that is not a valid message of its kind."""


class _Wire(BaseModel):
    # Devices may add fields we do not know; they are ignored, never trusted.
    model_config = ConfigDict(extra="ignore", frozen=True)


State = Annotated[dict[Annotated[str, Field(pattern=IDENTIFIER_PATTERN)], StateValue], Field(max_length=64)]


class Clamped(_Wire):
    actuator: str | None = None
    requested: Any = None
    applied: Any = None


ERROR_TEXT_LIMIT = 300


def _error_text(value: object) -> object:
    if not isinstance(value, str):
        return value
    return bounded(value, ERROR_TEXT_LIMIT) or "refused without a reason"


def _word(value: object) -> object:
    return bounded(value, 16) if isinstance(value, str) else value


class FailsafeReport(_Wire):
    """Why an actuator sits at its failsafe value: the firmware moved it there when the heartbeat was lost."""

    value: StateValue | None = None
    heartbeat_lost_ms: Annotated[int, Field(ge=0)] | None = None
    # What the device knew of the controller: unseen (no beat since boot), silent (beats stopped), gone (its Will).
    controller: Annotated[str | None, BeforeValidator(_word)] = None
    ts: Annotated[int, Field(ge=0)] | None = None
    error: Annotated[str | None, BeforeValidator(_error_text)] = None  # the actuator did not move

    def cause(self, actuator: str) -> str:
        """In words: "heater -> false after 3.0 s without the controller's heartbeat (its heartbeats stopped)"."""
        lost = f" after {self.heartbeat_lost_ms / 1000:.1f} s" if self.heartbeat_lost_ms is not None else ""
        said = _CONTROLLER_SAID.get(self.controller or "", "")
        text = f"{actuator} -> {json.dumps(self.value)}{lost} without the controller's heartbeat"
        text += f" ({said})" if said else ""
        return text + (f", but it did not move: {self.error}" if self.error else "")


_CONTROLLER_SAID = {"gone": "the controller's Last Will said it was gone", "silent": "its heartbeats stopped",
                    "unseen": "no heartbeat since the device booted"}


Failsafes = Annotated[dict[Annotated[str, Field(pattern=IDENTIFIER_PATTERN)], FailsafeReport], Field(max_length=64)]


class MaxOnReport(_Wire):
    """The firmware switched an actuator off by its on-time limit (max_on_seconds), with no controller involved."""

    value: StateValue | None = None  # the off value it went to
    on_ms: Annotated[int, Field(ge=0)] | None = None  # how long it had been on
    max_on_s: Annotated[float, Field(ge=0)] | None = None  # the limit its firmware was built with
    ts: Annotated[int, Field(ge=0)] | None = None
    error: Annotated[str | None, BeforeValidator(_error_text)] = None  # the actuator did not move

    def cause(self, actuator: str) -> str:
        """In words: "relay -> false after 4.0 h on (its on-time limit is 4.0 h)"."""
        on = f" after {_span(self.on_ms / 1000)} on" if self.on_ms is not None else ""
        limit = f" (its on-time limit is {_span(self.max_on_s)})" if self.max_on_s is not None else ""
        text = f"{actuator} -> {json.dumps(self.value)}{on}{limit}"
        return text + (f", but it did not move: {self.error}" if self.error else "")


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


MaxOnReports = Annotated[dict[Annotated[str, Field(pattern=IDENTIFIER_PATTERN)], MaxOnReport], Field(max_length=64)]


def _or_none(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A field that says more than the ack needs: dropped when malformed, so the ack itself is never lost."""
    try:
        return handler(value)
    except ValidationError:
        return None


class StaleEpoch(_Wire):
    sent: Annotated[int, Field(ge=0)]
    seen: Annotated[int, Field(ge=0)]


class Ack(_Wire):
    id: Annotated[str, Field(max_length=64)] | None
    ok: bool
    # Made safe and cut here, not refused: an ack must not be lost for the wording of its error.
    error: Annotated[str | None, BeforeValidator(_error_text)] = None
    state: State = Field(default_factory=dict)
    clamped: Clamped | None = None
    failsafe: Failsafes = Field(default_factory=dict)  # actuators at their failsafe value since a lost heartbeat
    max_on: Annotated[MaxOnReports | None, WrapValidator(_or_none)] = None  # switched off by their on-time limit
    # Set on a refusal because a newer controller epoch reached the device first (docs/protocol.md, "Epoch").
    stale_epoch: Annotated[StaleEpoch | None, WrapValidator(_or_none)] = None


class Sample(_Wire):
    metric: Annotated[str, Field(pattern=IDENTIFIER_PATTERN)]
    value: StateValue
    ts: Annotated[int, Field(ge=0)]


class Telemetry(_Wire):
    ts: Annotated[int, Field(ge=0)]
    samples: Annotated[list[Sample], Field(max_length=512)]


class DeviceEvent(_Wire):
    ts: Annotated[int, Field(ge=0)]
    event: Annotated[str, Field(pattern=IDENTIFIER_PATTERN)]
    value: StateValue | None = None
    seq: int | None = None
    state: State | None = None
    failsafe: Failsafes = Field(default_factory=dict)
    max_on: Annotated[MaxOnReports | None, WrapValidator(_or_none)] = None


def load_json(payload: bytes) -> Any:
    """Strict JSON: size-capped, UTF-8, no NaN/Infinity, bounded nesting."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise BadMessage(f"payload of {len(payload)} bytes exceeds the {MAX_PAYLOAD_BYTES}-byte limit")
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        raise BadMessage("payload is not UTF-8") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as err:
        raise BadMessage(f"payload is not valid JSON ({_short(err)})") from None
    if _deeper_than(value, MAX_DEPTH):
        raise BadMessage(f"payload nests deeper than {MAX_DEPTH} levels")
    _refuse_non_finite(value)
    return value


def parse_info(payload: bytes, device_id: str) -> Contract:
    data = load_json(payload)
    if not isinstance(data, dict):
        raise BadMessage("info must be a JSON object (the device contract)")
    try:
        contract = Contract.model_validate(data)
    except ValidationError as err:
        raise BadMessage(f"contract refused: {_validation_summary(err)}") from None
    if contract.device_id != device_id:
        raise BadMessage(f"contract names device_id {contract.device_id!r} but was published for {device_id!r}")
    return contract


def parse_status(payload: bytes) -> bool:
    text = payload.strip().decode("utf-8", errors="replace")
    if text in ("online", "offline"):
        return text == "online"
    raise BadMessage(f"status must be 'online' or 'offline', got {text[:40]!r}")


def parse_ack(payload: bytes) -> Ack:
    return _parse(Ack, payload, "ack")


def parse_telemetry(payload: bytes) -> Telemetry:
    return _parse(Telemetry, payload, "telemetry")


def parse_event(payload: bytes) -> DeviceEvent:
    return _parse(DeviceEvent, payload, "event")


def _parse(model: type[_Wire], payload: bytes, what: str) -> Any:
    data = load_json(payload)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise BadMessage(f"{what} refused: {_validation_summary(err)}") from None


def _validation_summary(err: ValidationError, limit: int = 3) -> str:
    parts = []
    for e in err.errors()[:limit]:
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        got = e.get("input")
        shown = f" (got {_short(repr(got))[:60]})" if isinstance(got, (str, int, float, bool)) else ""
        parts.append(f"{where}: {e['msg']}{shown}")
    more = len(err.errors()) - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed")


def _refuse_non_finite(value: Any) -> None:
    # Huge literals such as 1e999 parse to inf without passing through parse_constant.
    if isinstance(value, float) and not math.isfinite(value):
        raise BadMessage("numbers must be finite")
    if isinstance(value, dict):
        for v in value.values():
            _refuse_non_finite(v)
    elif isinstance(value, list):
        for v in value:
            _refuse_non_finite(v)


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether containers nest deeper than limit. Iterative: a hostile payload that JSON parsing still
    accepts (hundreds of levels) must not exhaust the stack here."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth + 1 > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def _short(err: object) -> str:
    return str(err)[:120]

"""The device contract: what a device says it is and what it can do, as announced on `iot/{id}/info`.

A contract is a build-time constant of the firmware; the controller accepts it
only through the allow-list in `allowlist.py`. These models are the single
description of its shape: the controller validates `info` payloads with them,
the Capability resource embeds them, and the firmware catalog is checked
against them.

Wire names are snake_case, as the firmware writes them.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from corral.contract.allowlist import ACTION_TYPES, ActionKind, ValueType
from corral.contract.text import safe_or_keep
from corral.contract.values import InvalidValue, check

Risk = Literal["low", "medium", "high", "critical"]
ActuatorLevel = Literal["write", "config"]

IDENTIFIER_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"
DEVICE_ID_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
ENUM_VALUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,31}$"

Identifier = Annotated[
    str, Field(pattern=IDENTIFIER_PATTERN, max_length=32, description="lower-case identifier, 1-32 characters")
]
DeviceId = Annotated[
    str, Field(pattern=DEVICE_ID_PATTERN, description="DNS label: lower-case letters, digits and '-', 1-63 characters")
]
# Device text is made safe before it is checked (contract.text): invisible and bidi characters removed,
# one line, NFC. The limits apply to what is left.
Label = Annotated[str, BeforeValidator(safe_or_keep), Field(min_length=1, max_length=64)]
Description = Annotated[str, BeforeValidator(safe_or_keep), Field(max_length=512)]
Unit = Annotated[str, BeforeValidator(safe_or_keep), Field(max_length=16)]
EnumValue = Annotated[str, Field(pattern=ENUM_VALUE_PATTERN, description=(
    "an enum value: ASCII letters, digits and . _ + -, starting with a letter or digit, 1-32 characters"))]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Range(_Frozen):
    """Closed interval of allowed values."""

    min: float = Field(description="Smallest allowed value.")
    max: float = Field(description="Largest allowed value.")

    @model_validator(mode="after")
    def _ordered_and_finite(self) -> Range:
        if not (math.isfinite(self.min) and math.isfinite(self.max)):
            raise ValueError("range bounds must be finite numbers")
        if self.min > self.max:
            raise ValueError(f"range min {self.min} is greater than max {self.max}")
        return self


# A sensor's publish interval: faster than 10 a second is a flood, not telemetry; slower than daily is not live.
SENSOR_MIN_INTERVAL_S = 0.1
SENSOR_MAX_INTERVAL_S = 86400.0


class Sensor(_Frozen):
    """One measured quantity, reported on the telemetry topic."""

    metric: Identifier = Field(description="Name of the measured quantity, e.g. temperature.")
    unit: Unit = Field(default="", description="Unit of the value, e.g. °C, %, g.")
    range: Range | None = Field(default=None, description="Physically plausible values; outside them a reading is malformed.")
    description: Description = Field(default="", description="What the sensor measures, for people and agents.")
    interval_s: float | None = Field(
        default=None, ge=SENSOR_MIN_INTERVAL_S, le=SENSOR_MAX_INTERVAL_S,
        description=("Seconds between two samples the device publishes (0.1 to 86400). A cited sample may be at most "
                     "2.5 intervals old, capped by the cluster (contract.freshness); without it the cluster's default "
                     "applies. A longer interval is a contract change a person accepts."),
    )


# An on-time limit shorter than a second is a pulse, not a limit; longer than a day is no limit.
MAX_ON_MIN_S = 1.0
MAX_ON_MAX_S = 86400.0
FAILSAFE_MIN_DELAY_S = 1.0
FAILSAFE_MAX_DELAY_S = 86400.0


class Failsafe(_Frozen):
    """What the firmware does by itself when it stops hearing the controller's heartbeat (docs/protocol.md)."""

    value: Annotated[bool | int | float | str, WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True})] = Field(
        description="The value the actuator moves to: a valid value of the actuator, exactly (not clamped)."
    )
    delay_s: float = Field(
        ge=FAILSAFE_MIN_DELAY_S, le=FAILSAFE_MAX_DELAY_S,
        description="Seconds without a heartbeat, counted from the last one heard, before the value is applied.",
    )


class Actuator(_Frozen):
    """One thing the device can be told to do, always as a target state."""

    id: Identifier = Field(description="Actuator id, unique within the device; commands name it.")
    name: Label = Field(description="Human-readable name.")
    type: ValueType = Field(description="Type of the target value.")
    action: ActionKind = Field(description="The one action kind that sets this actuator (from the allow-list).")
    values: list[EnumValue] | None = Field(
        default=None, max_length=64, description="Allowed values, for type enum (1-64 distinct values)."
    )
    range: Range | None = Field(default=None, description="Allowed values, for types number and counter.")
    step: float | None = Field(default=None, gt=0, description="Granularity of a number: values are min + k*step.")
    unit: Unit = Field(default="", description="Unit of a number, e.g. %, °C.")
    risk: Risk = Field(description="How much harm a wrong value can do; policy maps risk to required approvals.")
    level: ActuatorLevel = Field(description="Permission level needed to act: the RBAC verb on the Device.")
    description: Description = Field(default="", description="What the actuator does, for people and agents.")
    failsafe: Failsafe | None = Field(
        default=None,
        description="The value the firmware moves this actuator to once it has not heard the controller for a while.",
    )
    max_on_seconds: float | None = Field(
        default=None, ge=MAX_ON_MIN_S, le=MAX_ON_MAX_S,
        description=("The longest the actuator may stay on (any value but its off value: false, or 'off' for an "
                     "enum), in seconds. The firmware switches it off itself once that long has passed, controller "
                     "or not, and says so; the controller refuses a hold longer than this."),
    )
    # None, not False, when undeclared: a contract's hash (and so its Capability's name) covers only what it says.
    hold_required: bool | None = Field(
        default=None,
        description=("True: an Intent that switches the actuator on must carry a hold (holdFor) no longer than "
                     "max_on_seconds, so that it is switched off again by itself."),
    )

    @model_validator(mode="after")
    def _shape_fits_type(self) -> Actuator:
        allowed = ACTION_TYPES[self.action]
        if self.type not in allowed:
            raise ValueError(
                f"actuator {self.id!r}: action {self.action!r} takes type {' or '.join(sorted(allowed))}, not {self.type!r}"
            )
        if self.type == "enum":
            if not self.values:
                raise ValueError(f"actuator {self.id!r}: type enum needs a non-empty 'values' list")
            if len(set(self.values)) != len(self.values):
                raise ValueError(f"actuator {self.id!r}: 'values' has duplicates")
        elif self.values is not None:
            raise ValueError(f"actuator {self.id!r}: 'values' is only for type enum")
        if self.type in ("number", "counter"):
            if self.range is None:
                raise ValueError(f"actuator {self.id!r}: type {self.type} needs a 'range'")
        elif self.range is not None:
            raise ValueError(f"actuator {self.id!r}: 'range' is only for types number and counter")
        if self.step is not None and self.type != "number":
            raise ValueError(f"actuator {self.id!r}: 'step' is only for type number")
        if self.type == "counter" and self.range is not None and self.range.min < 0:
            raise ValueError(f"actuator {self.id!r}: a counter cannot go below 0")
        if self.failsafe is not None:
            self._failsafe_fits()
        if (self.max_on_seconds is not None or self.hold_required) and self.off_value() is None:
            raise ValueError(f"actuator {self.id!r}: max_on_seconds and hold_required need an off value: type bool "
                             "(off is false) or an enum with the value 'off'")
        return self

    def off_value(self) -> bool | str | None:
        """What "off" is for an on-time limit: false for a bool, 'off' for an enum that has it; None otherwise."""
        if self.type == "bool":
            return False
        if self.type == "enum" and self.values is not None and "off" in self.values:
            return "off"
        return None

    def is_on(self, value: object) -> bool:
        """Whether a value of this actuator counts as on, for its on-time limit (anything but its off value)."""
        off = self.off_value()
        return off is not None and value != off

    def _failsafe_fits(self) -> None:
        # The firmware checks the same (corral_fw.actuators.failsafe_of): a failsafe is a plain target value.
        if self.type == "counter" or self.action == "set_version":
            raise ValueError(f"actuator {self.id!r}: a {self.action} actuator cannot have a failsafe "
                             "(a failsafe never runs a momentary action or installs firmware)")
        assert self.failsafe is not None
        try:
            check(self, self.failsafe.value)
        except InvalidValue as err:
            raise ValueError(f"actuator {self.id!r}: failsafe value: {err}") from None


class EventSpec(_Frozen):
    """A discrete, debounced event the device publishes on its event topic."""

    name: Identifier = Field(description="Event name.")
    values: list[EnumValue] = Field(min_length=1, max_length=16, description="Values the event can carry.")
    description: Description = Field(default="", description="What the event means, for people and agents.")


class Contract(_Frozen):
    """A device's contract, as its firmware announces it (retained on `iot/{id}/info`)."""

    device_id: DeviceId = Field(description="The device's id, as in its topics.")
    name: Label = Field(description="Product name of the device type.")
    model: Label = Field(description="Model identifier.")
    fw: Annotated[str, Field(pattern=r"^\d+\.\d+\.\d+([-+][0-9A-Za-z.-]{1,32})?$")] = Field(
        description="Firmware version (semantic version)."
    )
    sensors: list[Sensor] = Field(default_factory=list, max_length=64, description="Measured quantities.")
    actuators: list[Actuator] = Field(default_factory=list, max_length=64, description="Things it can be told to do.")
    events: list[EventSpec] = Field(default_factory=list, max_length=32, description="Discrete events it publishes.")
    version: int | None = Field(
        default=None, ge=1, le=2**31 - 1,
        description=(
            "Contract version, raised by every signed release. Signed contracts carry one: the controller refuses "
            "a signed contract older than the one it accepted (a replay)."
        ),
    )
    signature: str | None = Field(
        default=None, max_length=256, description="Base64 Ed25519 signature over the canonical contract without it."
    )

    @model_validator(mode="after")
    def _unique_names(self) -> Contract:
        for what, names in (
            ("actuator id", [a.id for a in self.actuators]),
            ("sensor metric", [s.metric for s in self.sensors]),
            ("event name", [e.name for e in self.events]),
        ):
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise ValueError(f"duplicate {what}: {', '.join(duplicates)}")
        return self

    def actuator(self, actuator_id: str) -> Actuator | None:
        return next((a for a in self.actuators if a.id == actuator_id), None)

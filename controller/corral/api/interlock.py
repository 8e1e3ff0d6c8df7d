"""Interlock: a cross-device safety rule. A CEL condition over other Devices' state and latest readings that
must hold for the actions it guards (devices by name or label selector, actuators, values) in its namespace.

People write the spec; the controller compiles the condition (status condition Compiled) and evaluates it
whenever a guarded action is decided, again right before it runs, and before it drives a guarded target
(controller/corral/decide/interlocks.py).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, ValidationInfo, model_validator

from corral.api.base import DNS_LABEL, Condition, JsonValue, KubeModel, Resource, Text512
from corral.api.labels import derived, read_stored, refusal, selector_rules
from corral.contract.model import IDENTIFIER_PATTERN

# A condition is written by a person and read by agents: newlines and tabs may lay it out, no other control
# characters. The cap bounds what the API server stores and the compiler reads (one of the cost bounds).
CONDITION_MAX_LENGTH = 2048
_CONDITION_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _no_stray_control_characters(text: str) -> str:
    if _CONDITION_CONTROL.search(text):
        raise ValueError("must not contain control characters other than newlines and tabs")
    return text


CelCondition = Annotated[
    str,
    Field(min_length=1, max_length=CONDITION_MAX_LENGTH, json_schema_extra={"x-kubernetes-validations": [{
        "rule": "!self.matches('[\\\\x00-\\\\x08\\\\x0b-\\\\x1f\\\\x7f-\\\\x9f]')",
        "message": "must not contain control characters other than newlines and tabs",
    }]}),
    AfterValidator(_no_stray_control_characters),
]
LabelKey = Annotated[str, Field(min_length=1, max_length=317)]
LabelValue = Annotated[str, Field(max_length=63)]


class LabelSelectorRequirement(KubeModel):
    """One requirement on a label, as in Kubernetes label selectors."""

    key: LabelKey = Field(description="The label key the requirement applies to.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In, NotIn (also true when the label is absent), Exists or DoesNotExist."
    )
    values: Annotated[list[LabelValue], Field(max_length=64)] = Field(
        default_factory=list, description="Values for In and NotIn; empty for Exists and DoesNotExist."
    )


class LabelSelector(KubeModel):
    """Devices by label, as a Kubernetes label selector: every matchLabels entry and every expression must match.
    An empty selector matches every Device of the namespace. No key may be in Corral's own label domain
    (corral.dev/: the location an agent may change, the shard, ...): what guards or covers a Device never selects
    it by a label an agent can move or the controller derives."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": selector_rules()})

    match_labels: Annotated[dict[LabelKey, LabelValue], Field(max_length=64)] | None = Field(
        default=None, description="Labels a Device must carry with exactly these values."
    )
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=16)] | None = Field(
        default=None, description="Requirements a Device's labels must all meet."
    )

    @model_validator(mode="after")
    def _no_derived_labels(self, info: ValidationInfo) -> LabelSelector:
        # One stored before this rule is read as it is: the controller fails closed on it (api/labels.py).
        found = derived(self.label_keys())
        if found and not read_stored(info.context):
            raise ValueError(f"the selector key {refusal(found[0])}")
        return self

    def label_keys(self) -> list[str]:
        """Every label key the selector names, matchLabels first."""
        return [*(self.match_labels or {}), *(r.key for r in self.match_expressions or [])]


class InterlockGuards(KubeModel):
    """What the rule guards: actions on these Devices (by name, by selector, or both), for these actuators and
    values."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "(has(self.devices) && size(self.devices) > 0) || has(self.selector)",
        "message": "name the guarded Devices (devices) or select them by label (selector)",
    }]})

    devices: Annotated[list[Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]], Field(max_length=64)] = Field(
        default_factory=list, description="Names of guarded Devices in the Interlock's namespace."
    )
    selector: LabelSelector | None = Field(
        default=None, description="Guarded Devices by label (in addition to those named in devices)."
    )
    actuators: Annotated[list[Annotated[str, Field(pattern=IDENTIFIER_PATTERN, max_length=32)]],
                         Field(max_length=64)] = Field(
        default_factory=list, description="Guarded actuator ids; empty guards every actuator of the Devices."
    )
    values: Annotated[list[JsonValue], Field(max_length=64)] = Field(
        default_factory=list,
        description=("Target values the rule applies to (true, 'high', 40, ...: 1 is not true); empty applies to "
                     "every value."),
    )

    @model_validator(mode="after")
    def _something_guarded(self) -> InterlockGuards:
        if not self.devices and self.selector is None:
            raise ValueError("name the guarded Devices (devices) or select them by label (selector)")
        return self


class InterlockSpec(KubeModel):
    """The rule."""

    guards: InterlockGuards = Field(description="The actions the rule guards.")
    condition: CelCondition = Field(
        description=(
            "A CEL expression that must be true for a guarded action to run, over `devices` (Device name -> "
            "{reported: actuator states, online: bool}) and `readings` (Device name -> metric -> latest value, "
            "only readings younger than maxReadingAgeSeconds), Devices of this namespace only. E.g. "
            "!readings[\"leak-probe\"][\"wet\"]. An error (a missing Device or reading: no such key) counts as "
            "false. At most 2048 characters."
        ),
    )
    max_reading_age_seconds: int = Field(
        default=60, ge=1, le=86400,
        description=("Readings older than this (by when the controller received them) are left out of "
                     "`readings`, so a rule that needs them cannot hold."),
    )
    message: Text512 = Field(
        min_length=1, description="What the rule protects, in a sentence; shown with every action it denies."
    )


class InterlockStatus(KubeModel):
    """Whether the condition compiled; written only by the controller."""

    conditions: Annotated[list[Condition], Field(max_length=16)] = Field(
        default_factory=list,
        description=("Compiled: True when the condition compiled to a boolean expression, else the compiler's "
                     "message. SelectorAccepted: False (DerivedLabel) when the selector names a corral.dev/ label "
                     "(stored before admission refused that): the Interlock then forbids what it guards on every "
                     "Device of its namespace until a person rewrites the selector."),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(default=None, ge=0, description="The generation the controller compiled.")


class Interlock(Resource):
    """A cross-device safety rule: a guarded action runs only while its CEL condition holds."""

    kind_name = "Interlock"
    plural = "interlocks"
    singular = "interlock"
    scope = "Namespaced"
    short_names = ["ilk", "ilks"]
    printer_columns = [
        {"name": "Compiled", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Compiled\")].status"},
        {"name": "Message", "type": "string", "jsonPath": ".spec.message"},
        {"name": "Condition", "type": "string", "jsonPath": ".spec.condition", "priority": 1},
        {"name": "Max-Age", "type": "integer", "jsonPath": ".spec.maxReadingAgeSeconds", "priority": 1},
    ]

    kind: Literal["Interlock"] = "Interlock"
    spec: InterlockSpec = Field(description="The rule.")
    status: InterlockStatus | None = Field(default=None, description="Compilation, written by the controller.")

"""ApprovalGrant: an approval given in advance, in bounds. A person (the grantor) lets one requester's Intents on
these Devices, actuators and values run without asking each time, a number of times, until it expires.

The controller consumes one use per Intent, atomically (a write that fails if anyone else consumed one since it
read the grant), before the Intent executes; it checks the grantor's `approve` right again at every use and
never lets a grant cover a critical-risk action. Revoking is deleting the grant.

A grant to a Rule's ServiceAccount is voided when someone edits a Rule that acts as it (a new generation after
the first): the edit may have changed what the grant ends up letting run. The controller records it in
`status.voided` (which Rule, which revision, why, and the audit record) and the grant covers nothing from then
on. A person renews it by granting anew (`corral grants renew NAME` makes the same grant in their name, with the
uses left, and revokes the voided one): the spec is immutable, so a renewal is a grant of its own, made and
checked like any other.

A grant must say what it covers: Devices by name or by a selector with at least one label or requirement
(`selector: {}` counts as none), and a list of values or a numeric range. The API server refuses any other
(an unbounded grant once covered a high-risk lock Intent); the controller, for a grant made before that rule,
treats an empty selector and a missing list of values as covering nothing. Nor may the selector name a label of
Corral's own domain (corral.dev/location, which an agent may change, ...: api/labels.py); one stored before that
rule covers nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from corral.api.base import DNS_LABEL, Groups, JsonValue, KubeModel, Resource, Text512, Text1024
from corral.api.intent import AuditCitation
from corral.api.interlock import LabelSelector
from corral.contract.model import IDENTIFIER_PATTERN

MAX_USES = 1000


class ValueRange(KubeModel):
    """Numbers from minimum to maximum, both included."""

    minimum: float = Field(description="The smallest value granted.")
    maximum: float = Field(description="The largest value granted.")

    @model_validator(mode="after")
    def _ordered(self) -> ValueRange:
        if self.minimum > self.maximum:
            raise ValueError(f"range.minimum ({self.minimum:g}) is above range.maximum ({self.maximum:g})")
        return self


# Free JSON values have no type CEL could declare, so the API server checks this one in an admission policy
# (api.policies) rather than in the CRD's schema.
VALUES_REQUIRED = ("a grant must say which values it covers: list them (values) or give a numeric range "
                   "(range: {minimum, maximum}); a grant of any value is not in bounds")
# A selector says something only with at least one label or requirement: `selector: {}` would match every Device.
_SELECTS = ("(has(self.selector) && ((has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0) || "
            "(has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0)))")


class ApprovalGrantSpec(KubeModel):
    """What is granted, to whom, how often and until when. Immutable: revoke (delete) and grant again."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": f"(has(self.devices) && size(self.devices) > 0) || {_SELECTS}",
         "message": "a grant must say which Devices it covers: name them (devices) or select them by label with at "
                    "least one matchLabels entry or matchExpressions requirement (selector); an empty selector "
                    "({}) selects nothing"},
        {"rule": "self.requester != self.grantor", "message": "a grant to yourself is no second person's consent"},
    ]})

    grantor: Annotated[str, Field(min_length=1, max_length=512)] = Field(
        description="Username of the creator, the person who grants; the API server rejects any other value."
    )
    grantor_groups: Groups | None = Field(
        default=None, description="The creator's groups (filled in by corral); the API server rejects any other set."
    )
    requester: Annotated[str, Field(min_length=1, max_length=512)] = Field(
        description="The username whose Intents this grant covers (an agent's ServiceAccount: "
                    "system:serviceaccount:NAMESPACE:NAME)."
    )
    devices: Annotated[list[Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]], Field(max_length=64)] = Field(
        default_factory=list, description="Names of Devices in the grant's namespace."
    )
    selector: LabelSelector | None = Field(
        default=None, description="Devices by label (in addition to those named in devices); it needs at least one "
                                  "matchLabels entry or requirement: an empty selector covers nothing. No "
                                  "corral.dev/ label: only labels people set."
    )
    actuators: Annotated[list[Annotated[str, Field(pattern=IDENTIFIER_PATTERN, max_length=32)]],
                         Field(min_length=1, max_length=64)] = Field(description="Actuator ids the grant covers.")
    values: Annotated[list[JsonValue], Field(max_length=64)] = Field(
        default_factory=list, description="Target values granted (true, 'cool', 21, ...); a grant lists values or "
                                          "gives a range."
    )
    range: ValueRange | None = Field(default=None, description="Numeric target values granted, instead of a list.")
    uses: int = Field(ge=1, le=MAX_USES, description="How many Intents the grant lets run.")
    expires_at: datetime = Field(description="After this the grant covers nothing.")
    reason: Text512 = Field(default="", description="Why, in a sentence.")

    @model_validator(mode="after")
    def _bounded(self) -> ApprovalGrantSpec:
        if not self.devices and not _selects(self.selector):
            raise ValueError("a grant must say which Devices it covers: name them (devices) or select them by label "
                             "with at least one matchLabels entry or matchExpressions requirement (selector); an empty "
                             "selector ({}) selects nothing")
        if not self.values and self.range is None:
            raise ValueError(VALUES_REQUIRED)
        if self.values and self.range is not None:
            raise ValueError("grant either a list of values or a range, not both")
        if self.requester == self.grantor:
            raise ValueError("a grant to yourself is no second person's consent")
        return self


def _selects(selector: LabelSelector | None) -> bool:
    return selector is not None and bool(selector.match_labels or selector.match_expressions)


class GrantUse(KubeModel):
    """One Intent that ran under the grant."""

    intent: Annotated[str, Field(min_length=1, max_length=253)] = Field(description="Name of the Intent.")
    uid: Annotated[str, Field(max_length=36)] = Field(description="metadata.uid of that Intent.")
    at: datetime = Field(description="When the use was consumed.")


class GrantVoided(KubeModel):
    """The Rule revision that voided the grant; from then on it covers nothing until a person grants anew."""

    rule: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] = Field(description="The Rule that was edited.")
    generation: int = Field(ge=1, description="The Rule's revision (metadata.generation) that voided it.")
    author: Annotated[str, Field(max_length=512)] = Field(default="", description="Who wrote that revision.")
    at: datetime = Field(description="When the controller voided it.")
    message: Text1024 = Field(default="", description="Why, and how a person renews it.")
    audit: AuditCitation | None = Field(default=None, description="The audit record of the revision (rule.revised).")


class ApprovalGrantStatus(KubeModel):
    """How much of the grant is used; written only by the controller, one use at a time."""

    used: int = Field(default=0, ge=0, le=MAX_USES, description="Uses consumed so far.")
    consumed_by: Annotated[list[GrantUse], Field(max_length=MAX_USES)] = Field(
        default_factory=list, description="The Intents that used it, oldest first."
    )
    message: Text1024 = Field(default="", description="The last use, or why the grant no longer covers anything.")
    voided: GrantVoided | None = Field(
        default=None, description="Set when an edit of a Rule acting as the requester voided the grant: it covers "
                                  "nothing from then on (renew: corral grants renew NAME)."
    )


class ApprovalGrant(Resource):
    """A person's approval given in advance, in bounds: requester, devices, actuators, values, uses, expiry."""

    kind_name = "ApprovalGrant"
    plural = "approvalgrants"
    singular = "approvalgrant"
    scope = "Namespaced"
    short_names = ["grant", "grants"]
    printer_columns = [
        {"name": "Requester", "type": "string", "jsonPath": ".spec.requester"},
        {"name": "Grantor", "type": "string", "jsonPath": ".spec.grantor"},
        {"name": "Uses", "type": "integer", "jsonPath": ".spec.uses"},
        {"name": "Used", "type": "integer", "jsonPath": ".status.used"},
        {"name": "Expires", "type": "string", "format": "date-time", "jsonPath": ".spec.expiresAt"},
        {"name": "Voided-By", "type": "string", "jsonPath": ".status.voided.rule"},
        {"name": "Actuators", "type": "string", "jsonPath": ".spec.actuators", "priority": 1},
    ]

    kind: Literal["ApprovalGrant"] = "ApprovalGrant"
    spec: ApprovalGrantSpec = Field(
        description="The grant. Immutable.",
        json_schema_extra={"x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": "an ApprovalGrant's spec is immutable: revoke it (delete) and grant anew"}
        ]},
    )
    status: ApprovalGrantStatus | None = Field(default=None, description="Uses, written by the controller.")

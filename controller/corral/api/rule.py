"""Rule: acts without an agent. A CEL condition over named Devices' reported state and readings (the Interlock
environment) that holds for `for`, then a list of targets, carried out as Intents in the Rule's own identity (a
ServiceAccount of its namespace), re-armed after a cooldown.

Who wrote a revision is `spec.author`, which the API server binds to the writer (and `spec.authorGroups`, when
set, to the writer's groups, with which the controller reviews the author's rights); a revision by anyone who is not
a person acts only once a person with `approve` on rules has accepted it (the annotation `ACCEPTED_ANNOTATION`,
`<generation>:<username>`, also bound by the API server). The spec before an agent's edit is kept in
`PREVIOUS_SPEC_ANNOTATION`, so that one call restores it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import Field, model_validator

from corral.api.base import DNS_LABEL, SHA256_HEX, Condition, Groups, JsonValue, KubeModel, Resource, Text512, Text1024
from corral.api.durations import Duration, seconds_of
from corral.api.intent import AuditCitation
from corral.api.interlock import CelCondition
from corral.contract.allowlist import ActionKind
from corral.contract.model import IDENTIFIER_PATTERN

ACCEPTED_ANNOTATION: Final = "corral.dev/accepted"  # "<generation>:<username>" of the person who accepted it
PREVIOUS_SPEC_ANNOTATION: Final = "corral.dev/previous-spec"  # the spec before the last edit, JSON
RULE_LABEL: Final = "corral.dev/rule"  # on the Intents a Rule makes: the Rule's name
MAX_RULE_INTENTS: Final = 16  # the Intents a Rule's status remembers, newest first
MAX_RULE_REVISIONS: Final = 16  # the recorded revisions a Rule's status remembers, newest first

DeviceName = Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]
RuleState = Literal["Idle", "Holding", "Fired", "CoolingDown", "Stale", "Refused", "Paused", "AwaitingAcceptance",
                    "Invalid"]


class RuleAction(KubeModel):
    """One target the Rule sets when it fires: an Intent on one Device, decided like any other."""

    device: DeviceName = Field(description="Name of the Device in the Rule's namespace.")
    actuator: Annotated[str, Field(pattern=IDENTIFIER_PATTERN, max_length=32)] = Field(
        description="Actuator id from the device's contract."
    )
    action: ActionKind = Field(description="The action kind the actuator's contract names (set_state, set_level, ...).")
    value: JsonValue = Field(description="The target value, as the actuator's contract says.")
    hold_for: Duration | None = Field(default=None, description="A timed hold on the Intent (see Intent.spec.holdFor).")


class RuleSpec(KubeModel):
    """When to act, and what to do."""

    service_account_name: DeviceName = Field(
        description=("The ServiceAccount of this namespace whose identity the Rule's Intents carry: a Rule can do "
                     "nothing its ServiceAccount could not. Writing the Rule needs the right to impersonate it.")
    )
    author: Annotated[str, Field(min_length=1, max_length=512)] = Field(
        description="Username of whoever wrote this revision; the API server rejects any other value."
    )
    author_groups: Groups | None = Field(
        default=None,
        description=("The author's groups, as Kubernetes authenticated them when they wrote this revision (corral and "
                     "the gateway fill them in); the API server rejects any other set. The controller reviews the "
                     "author's rights with them. Unset: only what the username alone implies counts, so a person "
                     "whose rights come from a group must list them (kubectl auth whoami shows them)."),
    )
    inputs: Annotated[list[DeviceName], Field(min_length=1, max_length=32)] = Field(
        description="The Devices the condition reads; only they are in `devices` and `readings`."
    )
    condition: CelCondition = Field(
        description=("A CEL expression over `devices` (Device name -> {reported, online}) and `readings` (Device name "
                     "-> metric -> latest value, younger than maxReadingAgeSeconds), inputs only, e.g. "
                     "readings[\"leak-probe\"][\"wet\"]. The Rule fires once it has been true for `for`.")
    )
    for_: Duration = Field(
        default="0s", alias="for", description="How long the condition must hold before the Rule fires (e.g. 2s)."
    )
    cooldown: Duration = Field(
        default="5m", description="After firing, how long the Rule waits before it can fire again (e.g. 10m)."
    )
    max_reading_age_seconds: int = Field(
        default=60, ge=1, le=86400,
        description=("Readings older than this (by when the controller received them) are stale: the Rule does not "
                     "act on them, and says so."),
    )
    actions: Annotated[list[RuleAction], Field(min_length=1, max_length=16)] = Field(
        description="The targets it sets when it fires, one Intent each."
    )
    reason: Text512 = Field(min_length=1, description="Why, in a sentence: the reason on every Intent it makes.")
    dry_run: bool = Field(default=False, description="Evaluate and report in status, never act.")

    @model_validator(mode="after")
    def _durations_bounded(self) -> RuleSpec:
        if seconds_of(self.for_) > 86400 or seconds_of(self.cooldown) > 7 * 86400:
            raise ValueError("for is at most 24h and cooldown at most 168h")
        return self


class RuleIntent(KubeModel):
    """One Intent the Rule made, and how it ended."""

    name: Annotated[str, Field(max_length=253)] = Field(description="The Intent's name.")
    device: DeviceName = Field(description="Its Device.")
    code: Annotated[str, Field(max_length=32)] | None = Field(default=None, description="Its decision code, once final.")
    created_at: datetime = Field(description="When the Rule made it.")
    firing: int | None = Field(default=None, ge=1, description="The firing it belongs to.")
    action: int | None = Field(default=None, ge=0, description="Its action's index in spec.actions.")
    pending: bool | None = Field(
        default=None,
        description=("True while the name is chosen but the Intent not yet known to be made: the controller writes "
                     "the (random) name here first and then creates it, so a restart makes it under this name."),
    )


class RuleRevision(KubeModel):
    """One revision of the Rule as the controller recorded it (rule.revised): what a restore or an acceptance must
    match, since annotations are whatever their last writer put there."""

    generation: int = Field(ge=1, description="The Rule's generation.")
    spec_hash: Annotated[str, Field(pattern=SHA256_HEX, max_length=64)] = Field(
        description="SHA-256 of the canonical JSON of the spec, as the controller saw it."
    )
    author: Annotated[str, Field(max_length=512)] = Field(description="Who wrote it (spec.author).")
    audit: AuditCitation | None = Field(default=None, description="The rule.revised record.")


class RuleStatus(KubeModel):
    """What the Rule saw and did; written only by the controller."""

    state: RuleState | None = Field(
        default=None,
        description=("Idle (condition false), Holding (true, waiting for `for`), Fired, CoolingDown, Stale (inputs "
                     "offline or readings too old: not acting on them), Refused (its last Intent was refused: see "
                     "code), Paused, AwaitingAcceptance (written by an agent, not yet accepted by a person), Invalid."),
    )
    message: Text1024 = Field(default="", description="Why it did or did not fire, in a sentence.")
    code: Annotated[str, Field(max_length=32)] | None = Field(
        default=None, description="The decision code of its last refused Intent (DENY_INTERLOCK, DENY_SCOPE, ...)."
    )
    last_evaluated: datetime | None = Field(default=None, description="When the condition was last evaluated.")
    true_since: datetime | None = Field(default=None, description="Since when the condition has held, while it does.")
    last_fired: datetime | None = Field(default=None, description="When the Rule last fired.")
    firings: int = Field(default=0, ge=0, description="How many times it has fired; names its Intents.")
    intents: Annotated[list[RuleIntent], Field(max_length=MAX_RULE_INTENTS)] = Field(
        default_factory=list, description="The Intents it made, newest first (the last 16)."
    )
    accepted_generation: int | None = Field(
        default=None, ge=0, description="The generation a person wrote or accepted, which the Rule acts on."
    )
    revision_audit: AuditCitation | None = Field(
        default=None, description="The audit record of this revision (rule.revised)."
    )
    revisions: Annotated[list[RuleRevision], Field(max_length=MAX_RULE_REVISIONS)] = Field(
        default_factory=list,
        description=("The revisions the controller recorded (rule.revised), newest first (the last 16): a restore "
                     "or an acceptance acts only on a spec whose hash is here."),
    )
    fired_generation: int | None = Field(
        default=None, ge=0, description="The generation whose actions the last firing carries out."
    )
    conditions: Annotated[list[Condition], Field(max_length=16)] = Field(
        default_factory=list,
        description=("Compiled (the condition compiles), InputsFresh (every input online with readings young "
                     "enough), Accepted (a person wrote or accepted this revision), ContractsKnown (the contract of "
                     "every Device it sets is known, so its author's rights can be checked), IntentNames (its "
                     "Intents were made under the names it chose; IntentNameTaken names who held one)."),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(default=None, ge=0, description="The generation the controller saw.")


class Rule(Resource):
    """Acts without an agent: when its condition holds for a while, it sets targets through Intents in its own
    identity, which pass every check an agent's would."""

    kind_name = "Rule"
    plural = "rules"
    singular = "rule"
    scope = "Namespaced"
    short_names = ["rl"]
    printer_columns = [
        {"name": "State", "type": "string", "jsonPath": ".status.state"},
        {"name": "Last-Fired", "type": "date", "jsonPath": ".status.lastFired"},
        {"name": "ServiceAccount", "type": "string", "jsonPath": ".spec.serviceAccountName"},
        {"name": "Author", "type": "string", "jsonPath": ".spec.author", "priority": 1},
        {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
    ]

    kind: Literal["Rule"] = "Rule"
    spec: RuleSpec = Field(description="When to act and what to do.")
    status: RuleStatus | None = Field(default=None, description="What it saw and did, written by the controller.")

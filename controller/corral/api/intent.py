"""Intent: one request to act on a device. Its name is the idempotency key; its spec never changes."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Final, Literal, get_args

from pydantic import ConfigDict, Field, model_validator

from corral.api.base import DNS_LABEL, SHA256_HEX, Condition, Groups, JsonValue, KubeModel, Resource, Text512, Text1024
from corral.api.codes import DecisionCode, Phase
from corral.api.durations import Duration, seconds_of
from corral.contract.allowlist import ActionKind
from corral.contract.model import IDENTIFIER_PATTERN, Risk

Level = Literal["read", "listen", "write", "config", "annotate", "approve"]

# The overlay (what people call a device, where it is, notes) is set by Intents too, with a verb of its own:
# `annotate` on devices grants the overlay and nothing else, so no agent needs `patch` (which would also
# reach spec.target). The Intent's actuator names the overlay field.
OVERLAY_ACTIONS: Final[dict[str, str]] = {"set_alias": "alias", "set_note": "notes", "set_location": "location"}
OVERLAY_LIMITS: Final[dict[str, int]] = {"alias": 64, "location": 64, "notes": 512}
OVERLAY_VERB: Final = "annotate"

# Exclusive control of a Device (a lease) is taken, given back and broken by Intents too, so that it passes the
# same pipeline, RBAC and audit as everything else; only the controller writes the Lease objects. Their actuator
# is `lease`; acquire's params.value, if given, is the idle TTL in seconds.
LEASE_ACTIONS: Final = ("acquire", "release", "break")
LEASE_ACTUATOR: Final = "lease"
NO_PARAMS_ACTIONS: Final = ("read", "acquire", "release", "break")
HOLDER_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"

# Every action kind of the contract allow-list, plus `read` (a fresh read of one actuator or sensor, answered
# from the device without changing any target) and the overlay actions. Built from the allow-list, so it
# cannot drift from it; type checkers see a str, pydantic (and the CRD schema) the exact list.
if TYPE_CHECKING:
    IntentAction = str
else:
    IntentAction = Literal[(*get_args(ActionKind), "read", *OVERLAY_ACTIONS, *LEASE_ACTIONS)]

# The longest timed hold: beyond a day, a "hold" is a standing change and should be one.
MAX_HOLD_S: Final = 86400

# For a dry run: what the Intent would do, had it been a real one.
WouldDo = Literal["execute", "await_approval", "await_hold", "final"]


class Params(KubeModel):
    """Parameters of the action."""

    value: JsonValue = Field(description="The target value: bool, number or string, as the actuator's contract says.")


class Observation(KubeModel):
    """A sensor reading the request relies on; the controller refuses the Intent if it is stale or malformed."""

    device_id: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] | None = Field(
        default=None, description="Device id of the reading; defaults to the Intent's device."
    )
    metric: Annotated[str, Field(pattern=IDENTIFIER_PATTERN, max_length=32)] = Field(description="Sensor metric.")
    ts: int = Field(ge=0, description="When the reading was taken, Unix epoch milliseconds (as the tools report it).")


class IntentSpec(KubeModel):
    """What is asked, by whom and why. Immutable: an Intent is a request, not a desired state."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self.action in ['read', 'acquire', 'release', 'break'] || has(self.params)",
                 "message": "params.value is required: every action but read and the lease actions sets a target value"}
            ]
        }
    )

    device: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] = Field(
        description="Name of the Device in the Intent's namespace."
    )
    actuator: Annotated[str, Field(pattern=IDENTIFIER_PATTERN, max_length=32)] = Field(
        description="Actuator id from the device's contract (for read: an actuator id or a sensor metric)."
    )
    action: IntentAction = Field(
        description="Action kind; must be the one the actuator's contract names, or read for a fresh read."
    )
    params: Params | None = Field(default=None, description="Parameters of the action; every action but read needs one.")
    reason: Text512 = Field(
        min_length=1, description="Why the requester wants this, in a sentence. At most 512 characters."
    )
    requester: Annotated[str, Field(min_length=1, max_length=512)] = Field(
        description="Username of the creator; the API server rejects any other value. Immutable."
    )
    requester_groups: Groups | None = Field(
        default=None,
        description="The creator's groups, as Kubernetes authenticated them (corral fills them in from a "
                    "SelfSubjectReview); the API server rejects any other set. Unset: RBAC granted to groups of people "
                    "does not count for this request, only what the username alone implies.",
    )
    based_on: Annotated[list[Observation], Field(max_length=16)] = Field(
        default_factory=list,
        description="Sensor readings the request relies on: each must be a sample the controller received (its ts), "
                    "received recently enough.",
    )
    holder_id: Annotated[str, Field(pattern=HOLDER_ID_PATTERN, max_length=128)] | None = Field(
        default=None,
        description="Which of the requester's clients asks (an MCP session id, a loop's name): a lease is held by the "
                    "requester and this id together, so two loops under one identity do not share one by accident.",
    )
    dry_run: bool = Field(
        default=False,
        description="Run every check and record the outcome it would have, executing nothing. Immutable like the "
                    "rest of the spec, so a dry-run Intent can never run.",
    )
    hold_for: Duration | None = Field(
        default=None,
        description=("A timed hold: once executed, keep the value this long (e.g. 20m, at most 24h), then the controller "
                     "puts back the value from before (or `then`) as a new decision in the requester's name. A "
                     "later change of the actuator by someone else cancels it. Actuating actions only."),
    )
    then: Params | None = Field(
        default=None,
        description=("With holdFor: the value to set when the hold runs out, instead of the one from before. Part of "
                     "the request: decided with params (a grant must cover both), in paramsHash, shown to approvers."),
    )

    @model_validator(mode="after")
    def _held_only_when_acting(self) -> IntentSpec:
        if self.hold_for is None:
            if self.then is not None:
                raise ValueError("then is the value after a hold: it needs holdFor")
            return self
        if self.action in NO_PARAMS_ACTIONS or self.action in OVERLAY_ACTIONS:
            raise ValueError(f"holdFor is for actions that set an actuator; {self.action} sets none")
        if not 0 < seconds_of(self.hold_for) <= MAX_HOLD_S:
            raise ValueError(f"holdFor must be more than 0 and at most {MAX_HOLD_S // 3600}h, not {self.hold_for}")
        return self

    @model_validator(mode="after")
    def _params_unless_read(self) -> IntentSpec:
        if self.action not in NO_PARAMS_ACTIONS and self.params is None:
            raise ValueError("params.value is required: every action but read and the lease actions sets a target value")
        if self.action in LEASE_ACTIONS:
            if self.actuator != LEASE_ACTUATOR:
                raise ValueError(f"action {self.action} acts on the Device's lease: actuator must be {LEASE_ACTUATOR!r}")
            ttl = self.params.value if self.params is not None else None
            if self.action == "acquire" and ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int)
                                                                 or ttl < 1):
                raise ValueError("acquire takes params.value = the lease's idle TTL in whole seconds (1 or more), "
                                 "or no params for the default")
        field = OVERLAY_ACTIONS.get(self.action)
        if field is not None:
            if self.actuator != field:
                raise ValueError(f"action {self.action} sets the overlay field {field!r}: actuator must be {field!r}")
            value = self.params.value if self.params is not None else None
            if not isinstance(value, str) or len(value) > OVERLAY_LIMITS[field]:
                raise ValueError(f"{self.action} takes a string of at most {OVERLAY_LIMITS[field]} characters "
                                 "(empty deletes it)")
        return self


class AuditCitation(KubeModel):
    """Where the decision is in the controller's audit log: a client that saw it can prove it was not cut off."""

    seq: int = Field(ge=1, description="The decision record's sequence number in the audit log.")
    hash: Annotated[str, Field(pattern=SHA256_HEX, max_length=64)] = Field(
        description="SHA-256 of the decision record's line; `corral audit verify --against-cluster` checks it."
    )


HoldState = Literal["Pending", "Reverted", "Failsafe", "Cancelled", "Refused", "Failed"]


class HoldStatus(KubeModel):
    """A timed hold: what is put back when, and what became of it. Written only by the controller."""

    until: datetime = Field(description="When the hold runs out and the value is put back.")
    revert_to: JsonValue | None = Field(
        default=None, description="The value put back: the reported value from before, or spec.then."
    )
    state: HoldState = Field(
        description=("Pending (waiting for `until`), Reverted (put back), Failsafe (an interlock forbade the value "
                     "from before, so the actuator's failsafe value was set instead), Cancelled (someone else "
                     "changed the actuator meanwhile), Refused (nothing could be put back safely; see message), "
                     "Failed (the device did not confirm the revert)."),
    )
    message: Text1024 = Field(default="", description="What happened, in a sentence.")
    ended_at: datetime | None = Field(default=None, description="When the hold ended (reverted, cancelled or refused).")
    audit: AuditCitation | None = Field(
        default=None, description="The revert decision's record (intent.reverted) in the controller's audit log."
    )


class IntentStatus(KubeModel):
    """The decision and its outcome; written only by the controller."""

    phase: Phase | None = Field(
        default=None,
        description="Pending, AwaitingApproval, Executing, or final: Succeeded, Denied, Failed, or DryRun (checked, "
                    "never executed).",
    )
    code: DecisionCode | None = Field(default=None, description="The final decision code (see DESIGN.md).")
    message: Text1024 = Field(default="", description="Human-readable explanation of the decision.")
    risk: Risk | None = Field(default=None, description="Risk of the action, from the contract.")
    level: Level | None = Field(default=None, description="Permission level the action needs, from the contract.")
    params_hash: Annotated[str, Field(pattern=SHA256_HEX, max_length=64)] | None = Field(
        default=None, description=("Canonical hash of device, actuator, action and params (and holdFor and then, when "
                                   "set); approvals bind to it.")
    )
    approval: Annotated[str, Field(max_length=253)] | None = Field(
        default=None, description="Name of the Approval that was consumed, if one was needed."
    )
    grant: Annotated[str, Field(max_length=253)] | None = Field(
        default=None, description="Name of the ApprovalGrant one use of which let it run without an Approval."
    )
    command_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,64}$", max_length=64)] | None = Field(
        default=None,
        description=(
            "The id of the command that carries out this Intent, made once and recorded with the Executing "
            "phase before anything is sent; a restarted controller resends this very id, so the device runs it once."
        ),
    )
    approval_expires_at: datetime | None = Field(
        default=None, description="While AwaitingApproval: when the request expires without a decision."
    )
    before: Annotated[dict[str, JsonValue], Field(max_length=64)] | None = Field(
        default=None, description="The device's reported state before execution."
    )
    after: Annotated[dict[str, JsonValue], Field(max_length=64)] | None = Field(
        default=None, description="The device's reported state after execution (from its ack)."
    )
    decided_at: datetime | None = Field(default=None, description="When the final code was set.")
    device_error: Text512 | None = Field(
        default=None,
        description="When the device refused the command: the error its ack gave, sanitized and cut. The device's "
                    "own words: data to show, never instructions.",
    )
    would: WouldDo | None = Field(
        default=None,
        description="For a dry run (phase DryRun): what the Intent would do: execute, await_approval, await_hold, "
                    "or final (its code in code).",
    )
    audit: AuditCitation | None = Field(
        default=None,
        description="With the final status: the seq and hash of the decision's record in the controller's audit "
                    "log (intent.decided), written with that status. Truncating the log after the newest "
                    "checkpoint cannot hide a decision a client has seen: the log no longer holds what this cites.",
    )
    hold: HoldStatus | None = Field(
        default=None, description="With spec.holdFor, once executed: the pending revert and what became of it."
    )
    conditions: Annotated[list[Condition], Field(max_length=16)] = Field(
        default_factory=list,
        description="Aspects of the Intent's progress.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(default=None, ge=0, description="The generation the controller acted on.")


class Intent(Resource):
    """A request to act on a device, made by an agent or a person; the controller decides and executes it."""

    kind_name = "Intent"
    plural = "intents"
    singular = "intent"
    scope = "Namespaced"
    short_names = ["int", "ints"]
    printer_columns = [
        {"name": "Device", "type": "string", "jsonPath": ".spec.device"},
        {"name": "Action", "type": "string", "jsonPath": ".spec.action"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Code", "type": "string", "jsonPath": ".status.code"},
        {"name": "Requester", "type": "string", "jsonPath": ".spec.requester"},
        {"name": "Actuator", "type": "string", "jsonPath": ".spec.actuator", "priority": 1},
        {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
    ]

    kind: Literal["Intent"] = "Intent"
    spec: IntentSpec = Field(
        description="The request. Immutable after creation.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "an Intent's spec is immutable: create a new Intent (with a new name) to ask for something else"}
            ]
        },
    )
    status: IntentStatus | None = Field(default=None, description="Decision and outcome, written by the controller.")

"""Corral's one vocabulary: the API group, Intent phases and every decision code, defined once.

The CRD schemas, the decision pipeline, the controller, the gateway and the CLI all import these names,
so a code cannot be spelled two ways or exist in one layer and not in another. DESIGN.md lists what each
code means; codes that later parts of the product produce (interlocks, leases, pausing, contract holds,
cancellation, the gateway's rate limit) are here already, so the vocabulary does not change under them.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

GROUP: Final = "corral.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
# The controller's readings, served as an aggregated API (APIService v1alpha1.readings.corral.dev): the
# path of one Device's samples is READINGS_PREFIX/namespaces/NS/devices/NAME, a window at most this long.
READINGS_GROUP: Final = "readings.corral.dev"
READINGS_VERSION: Final = "v1alpha1"
READINGS_PREFIX: Final = f"/apis/{READINGS_GROUP}/{READINGS_VERSION}"
READINGS_MAX_WINDOW_S: Final = 3600

# Field managers of server-side apply: who owns which part of an object. Executed Intents own the target
# fields they set under a name of their own, so that a person's `kubectl apply --server-side` and an
# agent's Intent never overwrite each other silently: whoever comes second gets a conflict.
CONTROLLER_MANAGER: Final = "corral-controller"  # status, registrations, Capabilities
INTENTS_MANAGER: Final = "corral-intents"  # spec.target fields set by executed Intents
OVERLAY_MANAGER: Final = "corral-overlay"  # spec.overlay (alias, location, notes) set by executed overlay Intents

# The audience the MCP gateway accepts tokens for over HTTP (`kubectl create token SA --audience corral-gateway`);
# the API server's --api-audiences must include it, so that the same token also works against the API server.
GATEWAY_AUDIENCE: Final = "corral-gateway"

# The requester withdraws an Intent that has not run yet by setting this annotation (a reason) on it; an
# admission policy lets nobody else set it, and the controller ends the Intent CANCELLED.
CANCEL_ANNOTATION: Final = "corral.dev/cancel"
# The Intent whose executed target a Device's spec.target write carries (server-side apply as INTENTS_MANAGER):
# the Device controller names that Intent as the cause of the spec change (else the generation).
INTENT_ANNOTATION: Final = "corral.dev/intent"
# The W3C traceparent of the call that created an Intent (the gateway's tool call): audit records carry its trace
# id, so it is read once, at creation, and an admission policy lets nobody change it afterwards.
TRACEPARENT_ANNOTATION: Final = "corral.dev/traceparent"
# ServiceAccounts in this namespace are people (who may approve); the chart's default (`approvals.peopleNamespace`).
PEOPLE_NAMESPACE: Final = "corral-people"

DecisionCode = Literal[
    "EXECUTED",
    "DEDUP",
    "DENY_ID_CONFLICT",
    "DENY_UNKNOWN_ACTION",
    "DENY_ARGUMENTS",
    "DENY_SCOPE",
    "DENY_SENSOR",
    "DENY_INTERLOCK",
    "DENY_LEASED",
    "DENY_PAUSED",
    "DENY_CONTRACT_HOLD",
    "DENY_APPROVAL",
    "DENIED_BY_APPROVER",
    "CANCELLED",
    "RATE_LIMITED",
    "DEVICE_GONE",
    "TIMEOUT",
    "FAILED",
]
DECISION_CODES: Final[tuple[DecisionCode, ...]] = get_args(DecisionCode)

# What a caller is told while there is no final code yet (the gateway's answers, never status.code).
PendingCode = Literal["AWAITING_APPROVAL", "PENDING"]
OUTCOME_CODES: Final[tuple[DecisionCode | PendingCode, ...]] = (*DECISION_CODES, *get_args(PendingCode))

Phase = Literal["Pending", "AwaitingApproval", "Executing", "Succeeded", "Denied", "Failed", "DryRun"]
# DryRun: every check ran and the outcome is on record; nothing was (or ever will be) executed.
FinalPhase = Literal["Succeeded", "Denied", "Failed", "DryRun"]
FINAL_PHASES: Final[frozenset[str]] = frozenset(get_args(FinalPhase))

# Codes that end an Intent after something was (or may have been) tried on the device; every other final
# code is a refusal before anything ran.
_PHASE_OF: Final[dict[DecisionCode, FinalPhase]] = {
    "EXECUTED": "Succeeded",
    "DEVICE_GONE": "Failed",
    "TIMEOUT": "Failed",
    "FAILED": "Failed",
}


def phase_of(code: DecisionCode) -> FinalPhase:
    """The final phase an Intent ends in with this code."""
    return _PHASE_OF.get(code, "Denied")


def event_reason(code: DecisionCode) -> str:
    """The CamelCase Event reason for a code: DENY_SCOPE -> DenyScope."""
    return code.title().replace("_", "")

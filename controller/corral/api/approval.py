"""Approval: one human decision on one Intent, bound to its UID and the exact parameters (paramsHash)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from corral.api.base import SHA256_HEX, Groups, KubeModel, Resource, Text512, Text1024

UID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


class IntentRef(KubeModel):
    """The Intent decided on, by name and UID (a re-created Intent with the same name is another Intent)."""

    name: Annotated[str, Field(min_length=1, max_length=253)] = Field(description="Name of the Intent, same namespace.")
    uid: Annotated[str, Field(pattern=UID_PATTERN, max_length=36)] = Field(description="metadata.uid of that Intent.")


class ApprovalSpec(KubeModel):
    """The decision. Immutable: decide again by creating another Approval."""

    intent: IntentRef = Field(description="The Intent this decision is for.")
    params_hash: Annotated[str, Field(pattern=SHA256_HEX, max_length=64)] = Field(
        description="The Intent's status.paramsHash when the approver looked at it; a mismatch voids the approval."
    )
    decision: Literal["Approve", "Deny"] = Field(description="Approve or Deny.")
    approver: Annotated[str, Field(min_length=1, max_length=512)] = Field(
        description="Username of the creator; the API server rejects any other value. Immutable."
    )
    approver_groups: Groups | None = Field(
        default=None,
        description="The creator's groups (filled in by corral approve and the approval page); the API server rejects "
                    "any other set. Unset: a right granted to a group of the approver's does not count.",
    )
    reason: Text512 = Field(default="", description="Why, in a sentence (optional for Approve).")
    expires_at: datetime | None = Field(
        default=None, description="After this the approval no longer counts (the controller also caps its lifetime)."
    )


class ApprovalStatus(KubeModel):
    """Whether the approval counted and has been used; written only by the controller."""

    refused: bool | None = Field(
        default=None,
        description="True when this approval does not count (message says why); the Intent keeps waiting for one that does.",
    )
    consumed: bool | None = Field(default=None, description="True once an execution used this approval; it never counts again.")
    consumed_at: datetime | None = Field(default=None, description="When it was used.")
    message: Text1024 = Field(default="", description="Why the approval was or was not accepted.")


class Approval(Resource):
    """A human's one-time decision on one Intent with its exact parameters."""

    kind_name = "Approval"
    plural = "approvals"
    singular = "approval"
    scope = "Namespaced"
    short_names = ["apr", "aprs"]
    printer_columns = [
        {"name": "Intent", "type": "string", "jsonPath": ".spec.intent.name"},
        {"name": "Decision", "type": "string", "jsonPath": ".spec.decision"},
        {"name": "Approver", "type": "string", "jsonPath": ".spec.approver"},
        {"name": "Refused", "type": "boolean", "jsonPath": ".status.refused"},
        {"name": "Consumed", "type": "boolean", "jsonPath": ".status.consumed", "priority": 1},
        {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
    ]

    kind: Literal["Approval"] = "Approval"
    spec: ApprovalSpec = Field(
        description="The decision. Immutable.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "an Approval's spec is immutable: create a new Approval to decide again"}
            ]
        },
    )
    status: ApprovalStatus | None = Field(default=None, description="Use of the approval, written by the controller.")

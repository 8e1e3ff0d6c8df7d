"""AuditCheckpoint: where a component's audit log had reached, signed, for anyone with API access to hold it to.

The controller and the gateway each keep one (by default `corral-controller` and `corral-gateway`) and
replace its spec with every checkpoint they sign (audit.checkpoint). The spec is the signed checkpoint
itself: `corral audit verify` fetches it and checks the log against it, so a log cut short or rewritten
on its volume shows even to someone who never saw the volume. Every replacement moves
metadata.generation on, which nobody can move back.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from corral.api.base import SHA256_HEX, KubeModel, Resource


class AuditCheckpointSpec(KubeModel):
    """The newest signed checkpoint; the fields are those of audit.checkpoint.Checkpoint."""

    number: int = Field(ge=1, description="1, 2, 3, ...: one more for every checkpoint the component signs.")
    seq: int = Field(ge=0, description="The last audit record it covers.")
    head: Annotated[str, Field(pattern=SHA256_HEX, max_length=64)] = Field(description="That record's SHA-256.")
    at: datetime = Field(description="When it was signed.")
    previous: Annotated[str, Field(pattern=SHA256_HEX, max_length=64)] = Field(
        description="SHA-256 of the checkpoint before it (zeros for the first).")
    final: bool = Field(default=False, description="Signed as the component stopped: no record may follow it.")
    key: Annotated[str, Field(min_length=1, max_length=64)] = Field(description="Name of the signing key.")
    sig: Annotated[str, Field(max_length=128)] = Field(description="Ed25519 signature (base64).")


class AuditCheckpoint(Resource):
    """The newest checkpoint of one component's audit log, published by that component."""

    kind_name = "AuditCheckpoint"
    plural = "auditcheckpoints"
    singular = "auditcheckpoint"
    scope = "Namespaced"
    short_names = ["acp"]
    printer_columns = [
        {"name": "Number", "type": "integer", "jsonPath": ".spec.number"},
        {"name": "Seq", "type": "integer", "jsonPath": ".spec.seq"},
        {"name": "Signed", "type": "date", "jsonPath": ".spec.at"},
        {"name": "Final", "type": "boolean", "jsonPath": ".spec.final", "priority": 1},
    ]

    kind: Literal["AuditCheckpoint"] = "AuditCheckpoint"
    spec: AuditCheckpointSpec | None = Field(
        default=None, description="The newest checkpoint; absent until the component signs its first.")

"""Capability: a device contract as announced by firmware, validated and stored once per distinct content.

Cluster-scoped and content-addressed: the name carries a hash of the contract
(without the device id), so identical devices share one Capability and a
changed contract is a new Capability, never an edit of an old one.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from corral.api.base import SHA256_HEX, Condition, KubeModel, Resource, Text64
from corral.contract.canonical import capability_content, capability_hash
from corral.contract.model import Actuator, Contract, EventSpec, Sensor

NAME_HASH_LENGTH = 16


class CapabilitySpec(KubeModel):
    """The validated contract, shared by every device that announces the same one. Immutable."""

    model: Text64 = Field(description="Model identifier from the firmware.")
    name: Text64 = Field(description="Product name of the device type.")
    fw: Annotated[str, Field(max_length=64)] = Field(description="Firmware version that announced this contract.")
    version: int | None = Field(default=None, ge=1, le=2**31 - 1,
                                description="The contract's version, when it carries one (signed contracts do).")
    sensors: Annotated[list[Sensor], Field(max_length=64)] = Field(default_factory=list, description="Measured quantities.")
    actuators: Annotated[list[Actuator], Field(max_length=64)] = Field(
        default_factory=list, description="What devices of this type can be told to do, each with its risk and level."
    )
    events: Annotated[list[EventSpec], Field(max_length=32)] = Field(
        default_factory=list, description="Discrete events devices of this type publish."
    )
    content_hash: Annotated[str, Field(pattern=SHA256_HEX, max_length=64)] = Field(
        description="SHA-256 of the canonical contract content; the name ends with its first 16 hex digits."
    )

    @classmethod
    def from_contract(cls, contract: Contract) -> CapabilitySpec:
        return cls.model_validate({**capability_content(contract), "contentHash": capability_hash(contract)})

    def contract(self, device_id: str) -> Contract:
        """The contract this Capability holds, as the device `device_id` would announce it (unsigned)."""
        content = self.model_dump(mode="json", by_alias=False, exclude={"content_hash"}, exclude_none=True)
        return Contract.model_validate({**content, "device_id": device_id})


class CapabilityStatus(KubeModel):
    """Where the Capability is used; written by the controller."""

    devices: int | None = Field(default=None, ge=0, description="How many Devices currently use this Capability.")
    conditions: Annotated[list[Condition], Field(max_length=16)] = Field(
        default_factory=list,
        description="Aspects of the Capability's state.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


class Capability(Resource):
    """A validated device contract, content-addressed and shared by identical devices."""

    kind_name = "Capability"
    plural = "capabilities"
    singular = "capability"
    scope = "Cluster"
    short_names = ["cap", "caps"]
    printer_columns = [
        {"name": "Model", "type": "string", "jsonPath": ".spec.model"},
        {"name": "Firmware", "type": "string", "jsonPath": ".spec.fw"},
        {"name": "Devices", "type": "integer", "jsonPath": ".status.devices"},
    ]

    root_validations = [
        {
            "rule": "self.metadata.name.endsWith('-' + self.spec.contentHash.substring(0, 16))",
            "message": "a Capability's name must end with '-' and the first 16 hex digits of spec.contentHash",
        }
    ]

    kind: Literal["Capability"] = "Capability"
    spec: CapabilitySpec = Field(
        description="The contract. Immutable: a changed contract is a new Capability.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "a Capability is content-addressed and immutable; a changed contract gets a new Capability"}
            ]
        },
    )
    status: CapabilityStatus | None = Field(default=None, description="Usage, written by the controller.")

    @model_validator(mode="after")
    def _name_carries_the_hash(self) -> Capability:
        suffix = "-" + self.spec.content_hash[:NAME_HASH_LENGTH]
        if self.metadata.name is not None and not self.metadata.name.endswith(suffix):
            raise ValueError(f"a Capability's name must end with {suffix!r} (from spec.contentHash)")
        return self


def capability_name(contract: Contract) -> str:
    """`{model}-{hash16}`, lower-cased to a DNS subdomain."""
    slug = re.sub(r"[^a-z0-9]+", "-", contract.model.lower()).strip("-")[:40].rstrip("-") or "device"
    return f"{slug}-{capability_hash(contract)[:NAME_HASH_LENGTH]}"

"""DiscoveredDevice: a device the bridge found (Home Assistant MQTT discovery, zigbee2mqtt), a candidate until a person
accepts it.

Written only by the bridge's ServiceAccount (server-side apply, field manager `corral-bridge`); agents have no RBAC
on it, so they see nothing of a candidate. `corral devices accept-discovered` (a person) turns it into a Device with
`spec.bridge` and records the acceptance in its status. What is here is what the bridge says: the person who accepts
it reads it, and the controller trusts the accepted Device's `spec.bridge`, never this object.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from corral.api.base import DNS_LABEL, SHA256_HEX, Condition, KubeModel, Resource, Text512
from corral.api.capability import CapabilitySpec
from corral.contract.canonical import capability_hash
from corral.contract.model import Contract

# One MQTT topic name, never a filter: a wildcard here would become a broker grant over many topics (the accepted
# topics become ACLs, devices.bridge_accounts), and `$` topics are the broker's own.
TOPIC_PATTERN = r"^[^+#$\x00-\x1f\x7f][^+#\x00-\x1f\x7f]*$"
Topic = Annotated[str, Field(pattern=TOPIC_PATTERN, min_length=1, max_length=256)]
TopicList = Annotated[list[Topic], Field(max_length=32)]
SourceName = Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]


class BridgedTopics(KubeModel):
    """The device's own MQTT topics at its source (not Corral's `iot/...` topics)."""

    command: TopicList = Field(default_factory=list, description="Where the bridge publishes the device's commands.")
    state: TopicList = Field(default_factory=list, description="Where the device (its source's account) reports state.")
    availability: TopicList = Field(default_factory=list, description="Where the device's source says online/offline.")

    def all(self) -> list[str]:
        return [*self.command, *self.state, *self.availability]


class LeftOutPart(KubeModel):
    """Something discovered that did not become part of the contract, and why."""

    what: Text512 = Field(description="What was left out, e.g. 'light.kitchen (effect)'.")
    reason: Text512 = Field(description="Why, in a sentence.")


class DiscoveredDeviceSpec(KubeModel):
    """What the bridge discovered and derived. Written by the bridge only."""

    source: SourceName = Field(description=(
        "The source as discovery names it, made a DNS label: the Home Assistant discovery node id (ha) or the "
        "zigbee2mqtt base topic. Accepting finds the registered source (corral bridge add-source) by it."))
    source_kind: Literal["ha", "zigbee2mqtt"] = Field(description="Its discovery format: ha (Home Assistant MQTT "
                                                                   "discovery) or zigbee2mqtt (exposes).")
    device_id: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] = Field(
        description="The device id the bridge derived: its Corral topics are iot/{deviceId}/...")
    contract: CapabilitySpec = Field(description=("The contract the bridge derived from discovery (unsigned), in a "
                                                  "Capability's form."))
    contract_hash: Annotated[str, Field(pattern=SHA256_HEX, max_length=64)] = Field(
        description="SHA-256 of the contract's canonical content, as a Capability's name carries it.")
    left_out: Annotated[list[LeftOutPart], Field(max_length=128)] = Field(
        default_factory=list, description="What discovery described that the contract leaves out, and why.")
    topics: BridgedTopics = Field(default_factory=BridgedTopics, description="The device's own topics at its source.")
    discovered_at: datetime | None = Field(default=None, description="When the bridge last read its discovery data.")


class DiscoveredDeviceStatus(KubeModel):
    """The acceptance, recorded by `corral devices accept-discovered`."""

    accepted: bool | None = Field(default=None, description="Whether a person accepted it (a Device was made).")
    accepted_by: Annotated[str, Field(max_length=512)] | None = Field(default=None, description="Who accepted it.")
    accepted_at: datetime | None = Field(default=None, description="When.")
    device: Annotated[str, Field(max_length=253)] | None = Field(default=None, description="The Device it became.")
    conditions: Annotated[list[Condition], Field(max_length=16)] = Field(
        default_factory=list,
        description="Aspects of the candidate's state.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


class DiscoveredDevice(Resource):
    """A device the bridge discovered: a candidate, invisible to agents, until a person accepts it."""

    kind_name = "DiscoveredDevice"
    plural = "discovereddevices"
    singular = "discovereddevice"
    scope = "Namespaced"
    short_names = ["discovered"]
    printer_columns = [
        {"name": "Source", "type": "string", "jsonPath": ".spec.source"},
        {"name": "Kind", "type": "string", "jsonPath": ".spec.sourceKind"},
        {"name": "Model", "type": "string", "jsonPath": ".spec.contract.model"},
        {"name": "Accepted", "type": "boolean", "jsonPath": ".status.accepted"},
        {"name": "Device", "type": "string", "jsonPath": ".status.device"},
        {"name": "Device-ID", "type": "string", "jsonPath": ".spec.deviceId", "priority": 1},
    ]

    kind: Literal["DiscoveredDevice"] = "DiscoveredDevice"
    spec: DiscoveredDeviceSpec = Field(description="What the bridge discovered.")
    status: DiscoveredDeviceStatus | None = Field(default=None, description="The acceptance, written by a person's "
                                                                            "`corral devices accept-discovered`.")


def contract_hash(contract: Contract) -> str:
    """The hash a DiscoveredDevice and a Device's spec.bridge.acceptedContractHash carry (a Capability's)."""
    return capability_hash(contract)

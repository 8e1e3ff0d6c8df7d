"""Device: one physical device, its desired target state and the user's overlay; status from the controller."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import Field, field_serializer

from corral.api.base import DNS_LABEL, SHA256_HEX, Condition, JsonValue, KubeModel, Resource, Text16, Text64, Text512
from corral.api.discovered import BridgedTopics
from corral.contract.model import IDENTIFIER_PATTERN

IMMUTABLE: dict[str, Any] = {"rule": "self == oldSelf", "message": "deviceId is immutable: delete the Device and create a new one to bind another device"}

# The API server cannot type-check free JSON values with CEL (they have no
# type it could declare), so actuator ids and value types are checked by these
# models and, against the contract, by the controller; the schema bounds size.
ActuatorStates = Annotated[
    dict[Annotated[str, Field(pattern=IDENTIFIER_PATTERN, max_length=32)], JsonValue],
    Field(max_length=64),
]


# A person's freshness limit for cited readings of one metric (seconds): what contract.freshness derives otherwise.
FreshnessLimits = Annotated[
    dict[Annotated[str, Field(pattern=IDENTIFIER_PATTERN, max_length=32)], Annotated[float, Field(ge=0.1, le=3600)]],
    Field(max_length=64),
]


class Overlay(KubeModel):
    """What people say about the device; agents read it, it never reaches the device."""

    alias: Text64 = Field(
        default="", description="Friendly name, e.g. 'bedroom fan'. At most 64 characters, no control characters."
    )
    # Free text for people; the controller also makes it the Device's label corral.dev/location (api/locations.py:
    # "Utility room" -> utility-room), so label selectors (kubectl -l, iot.control's selector) can pick by place.
    location: Text64 = Field(
        default="", description="Where the device is, e.g. 'kitchen, above the sink'. At most 64 characters."
    )
    notes: Text512 = Field(
        default="", description="Free notes for people and agents. At most 512 characters, no control characters."
    )


# Risk levels a person may give a bridged actuator (contract.model.Risk).
BridgeRisk = Literal["low", "medium", "high", "critical"]


class BridgeBinding(KubeModel):
    """A bridged device: the candidate a person accepted (`corral devices accept-discovered`). Its presence makes the
    controller accept the bridge's unsigned contract, at first binding only with the accepted content hash."""

    source: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] = Field(
        description="The bridged source the device speaks through (its broker account publishes the state topics).")
    discovered: Annotated[str, Field(max_length=253)] = Field(description="The DiscoveredDevice it was accepted from.")
    accepted_contract_hash: Annotated[str, Field(pattern=SHA256_HEX, max_length=64)] = Field(
        description=("Content hash of the contract the person accepted (risk overrides applied). The bridge's unsigned "
                     "contract binds at first only with this hash; later changes are judged like a native device's "
                     "and accepted with `corral devices accept-contract`."))
    accepted_by: Annotated[str, Field(max_length=512)] = Field(default="", description="Who accepted it.")
    risk: Annotated[dict[Annotated[str, Field(pattern=IDENTIFIER_PATTERN, max_length=32)], BridgeRisk],
                    Field(max_length=64)] | None = Field(
        default=None, description=("A person's risk per actuator, over the bridge's mapping by component and device "
                                   "class; the bridge announces the contract with it. A lowered risk is a widening "
                                   "and is held until accepted."))
    left_out: Annotated[list[Text512], Field(max_length=32)] = Field(
        default_factory=list,
        description=("What the bridge discovered and could not offer (\"what: why\"), as the person saw it when "
                     "accepting; the Device's condition Bridged names it."))
    topics: BridgedTopics = Field(
        default_factory=BridgedTopics,
        description=("The device's own topics at its source, as accepted: the controller grants the source's account "
                     "its state and availability topics and the bridge's account these, nothing else."))


class DeviceSpec(KubeModel):
    """The desired state of a device."""

    device_id: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] = Field(
        description="The device's id as in its MQTT topics (iot/{deviceId}/...). Immutable.",
        json_schema_extra={"x-kubernetes-validations": [IMMUTABLE]},
    )
    target: ActuatorStates = Field(
        default_factory=dict,
        description=(
            "Desired actuator states, actuator id -> value (bool, number or string as the device's contract "
            "says). The controller drives the device here; executed Intents write to it."
        ),
    )
    overlay: Overlay | None = Field(default=None, description="Alias, location and notes kept by people.")
    accept_capability: Annotated[str, Field(max_length=253)] | None = Field(
        default=None,
        description=(
            "A person accepts this Capability (the name in status.capability) for a Device held because its "
            "contract changed in a way that asks for more trust (ContractAccepted=False). Set by `corral devices "
            "accept-contract`; changing it needs the approve verb on the Device."
        ),
    )
    freshness: FreshnessLimits | None = Field(
        default=None,
        description=(
            "A person's limit, metric -> seconds (0.1 to 3600), on how long ago a reading of this Device's sensor may "
            "have been received for an Intent to cite it (basedOn). It replaces the limit the contract's publish "
            "interval gives (2.5 x interval, capped by the cluster). Setting or changing it needs the approve verb on "
            "the Device."
        ),
    )
    bridge: BridgeBinding | None = Field(
        default=None,
        description=("Set when the device is bridged (a self-describing third-party device spoken for by `corral "
                     "bridge`): whom a person accepted it from. Set by `corral devices accept-discovered`."),
    )
    drift: Literal["Enforce", "Observe"] = Field(
        default="Enforce",
        description=(
            "What to do when the device's reported state differs from target: Enforce drives it back, "
            "Observe records the drift (condition and Event) and leaves the device alone."
        ),
    )


class SensorReading(KubeModel):
    """The latest value of one sensor."""

    value: JsonValue = Field(description="The value as the device reported it.")
    unit: Text16 = Field(default="", description="Unit of the value, from the contract.")
    timestamp: datetime = Field(description="When the device measured it.")

    @field_serializer("timestamp", when_used="json")
    def _milliseconds(self, moment: datetime) -> str:
        # Devices stamp samples in epoch milliseconds: RFC 3339 with (at most) that precision.
        moment = moment.astimezone(UTC)
        fraction = f".{moment.microsecond // 1000:03d}" if moment.microsecond else ""
        return moment.strftime("%Y-%m-%dT%H:%M:%S") + fraction + "Z"


class GuardingInterlock(KubeModel):
    """An Interlock that guards actions on this device (its rule; whether it holds is decided per action)."""

    name: Annotated[str, Field(max_length=253)] = Field(description="Name of the Interlock, same namespace.")
    actuators: Annotated[list[Annotated[str, Field(max_length=32)]], Field(max_length=64)] = Field(
        default_factory=list, description="Guarded actuators; empty: every actuator."
    )
    condition: Annotated[str, Field(max_length=2048)] = Field(description="The CEL condition that must hold.")
    message: Text512 = Field(description="What the rule protects.")
    compiled: bool = Field(description="False when the condition does not compile: then it forbids what it guards.")


class InterlockedTarget(KubeModel):
    """A target the controller does not drive because an interlock forbade it when it was to be driven."""

    actuator: Annotated[str, Field(pattern=IDENTIFIER_PATTERN, max_length=32)] = Field(description="Actuator id.")
    value: JsonValue = Field(description="The held target value.")
    interlock: Annotated[str, Field(max_length=253)] = Field(description="The Interlock that forbade it.")
    message: Annotated[str, Field(max_length=1024)] = Field(description="Why, as the interlock said it.")


class DeviceStatus(KubeModel):
    """What the controller last observed; written only by the controller."""

    online: bool | None = Field(default=None, description="Whether the device's MQTT status is online.")
    last_seen: datetime | None = Field(default=None, description="When any message from the device last arrived.")
    stale: bool | None = Field(
        default=None, description="True while offline: reported and sensors are the last known values, not current ones."
    )
    capability: Annotated[str, Field(max_length=253)] | None = Field(
        default=None, description="Name of the cluster-scoped Capability holding the device's validated contract."
    )
    accepted_capability: Annotated[str, Field(max_length=253)] | None = Field(
        default=None,
        description=(
            "The Capability whose contract the controller trusts for this device: the first one it announced "
            "after enrollment, later ones that ask for no more trust, or one a person accepted. While it differs "
            "from capability, the Device is held (ContractAccepted=False)."
        ),
    )
    reported: ActuatorStates = Field(
        default_factory=dict, description="The device's full actuator state from its last ack or info."
    )
    sensors: Annotated[dict[str, SensorReading], Field(max_length=64)] = Field(
        default_factory=dict, description="Latest reading per sensor metric."
    )
    in_sync: bool | None = Field(default=None, description="True when reported matches target for every targeted actuator.")
    conditions: Annotated[list[Condition], Field(max_length=16)] = Field(
        default_factory=list,
        description="Ready, ContractValid, InSync, Interlocked and other aspects of the device's state.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    interlocks: Annotated[list[GuardingInterlock], Field(max_length=32)] | None = Field(
        default=None, description="The Interlocks that guard actions on this device."
    )
    interlocked_targets: Annotated[list[InterlockedTarget], Field(max_length=64)] | None = Field(
        default=None,
        description=(
            "Targets not driven because an interlock forbade them (condition Interlocked). They stay held even once "
            "the rule holds again: only a changed target is driven, or an Intent that passes the interlocks."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["actuator"]},
    )
    observed_generation: int | None = Field(default=None, ge=0, description="The generation the controller acted on.")
    command_epoch: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Re-drives after drift at this generation. Part of every command id, so that a re-drive is never "
            "mistaken by the firmware for a repeat of an earlier command."
        ),
    )


class Device(Resource):
    """One physical device: desired target state and user overlay (spec), observed state (status)."""

    kind_name = "Device"
    plural = "devices"
    singular = "device"
    scope = "Namespaced"
    short_names = ["dev", "devs"]
    printer_columns = [
        {"name": "Online", "type": "boolean", "jsonPath": ".status.online"},
        {"name": "Alias", "type": "string", "jsonPath": ".spec.overlay.alias"},
        {"name": "Location", "type": "string", "jsonPath": ".spec.overlay.location"},
        {"name": "In-Sync", "type": "boolean", "jsonPath": ".status.inSync"},
        {"name": "Device-ID", "type": "string", "jsonPath": ".spec.deviceId", "priority": 1},
        {"name": "Bridged-From", "type": "string", "jsonPath": ".spec.bridge.source", "priority": 1},
    ]

    kind: Literal["Device"] = "Device"
    spec: DeviceSpec = Field(description="Desired state.")
    status: DeviceStatus | None = Field(default=None, description="Observed state, written by the controller.")

"""What every discovery format is read into, and what the bridge derives from it. Pure.

Both formats become `Component`s: one Home Assistant MQTT entity each, its configuration with every key spelled
out (abbreviations expanded, the `~` base topic substituted), as Home Assistant itself would read it. zigbee2mqtt's
exposes are read into the same shape (the way zigbee2mqtt's own Home Assistant extension maps them), so that one
mapping (mapping.py) and one codec (codec.py) serve both. A physical device is the components that share a
`DeviceKey`; it becomes one Corral Device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

SourceKind = Literal["ha", "zigbee2mqtt"]

# The Home Assistant components the bridge reads (anything else is left out, named).
COMPONENTS: tuple[str, ...] = ("switch", "light", "fan", "cover", "lock", "valve", "number", "select", "climate",
                               "binary_sensor", "sensor")


@dataclass(frozen=True)
class DeviceKey:
    """Which physical device a component belongs to: its source and the device's own identifier there (Home
    Assistant's device.identifiers[0], else the discovery node id; zigbee2mqtt's ieee address)."""

    source: str  # e.g. "ha:living-room-node" or "zigbee2mqtt:zigbee2mqtt" (kind and node id / base topic)
    identifier: str


@dataclass(frozen=True)
class DeviceInfo:
    """What the device says about itself: text, unsanitized here (the mapping sanitizes it, contract.text)."""

    name: str = ""
    manufacturer: str = ""
    model: str = ""
    sw_version: str = ""


@dataclass(frozen=True)
class Component:
    """One entity of a discovered device, with its configuration as Home Assistant reads it."""

    key: DeviceKey
    component: str  # switch, light, fan, ... (COMPONENTS), or another name (left out by the mapping)
    object_id: str  # unique within the device (the discovery object id / the expose's property)
    config: Mapping[str, Any]  # full key names, `~` substituted: command_topic, state_topic, payload_on, ...
    device: DeviceInfo = DeviceInfo()
    discovery_topic: str = ""  # where it was announced (for people; the retained config)


@dataclass(frozen=True)
class LeftOut:
    """Something discovered that does not become part of the contract, and why (shown in the Device's status)."""

    what: str  # e.g. "light.kitchen (effect)", "climate.hvac: hvac_mode"
    reason: str  # a sentence: "its command_template goes beyond value extraction: '{{ value | tojson }}'"


@dataclass(frozen=True)
class Discovered:
    """One physical device as discovered: its components and what parsing already left out."""

    key: DeviceKey
    device: DeviceInfo
    components: tuple[Component, ...] = ()
    left_out: tuple[LeftOut, ...] = field(default_factory=tuple)

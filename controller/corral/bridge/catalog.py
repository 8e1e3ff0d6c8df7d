"""What discovery says right now, over every source the bridge hears, and one device's derived contract and codec.

`Catalog.read(topic, payload)` takes any message on a discovery topic (Home Assistant `<prefix>/.../config`,
zigbee2mqtt `<base>/bridge/devices` and `<base>/bridge/info`) and returns the devices it changed; `device(key)`
and `find(device_id)` give the current `Discovered`. `derive` wraps mapping.derive into what the runtime speaks
with (`Bridged`: contract, topics, and the codec's command, readings and availability). Pure: no MQTT here.

zigbee2mqtt's optimistic echo: zigbee2mqtt publishes the requested state right after it sent a command when the
device option `optimistic` is on (its default), before and whatever the device itself reports. `bridge/info`
carries the options (`config.device_options.optimistic`, `config.devices[<ieee>].optimistic`); where it is on or
unknown the bridge skips one matching state message after a command (bridge/confirm.py), so only the device's own
report that follows confirms.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.bridge import discovery, exposes
from corral.bridge.mapping import Derived, Topics, make_device_id
from corral.bridge.mapping import derive as derive_contract
from corral.bridge.model import DeviceInfo, DeviceKey, Discovered, SourceKind
from corral.contract.model import Contract
from corral.contract.values import Value

log = logging.getLogger(__name__)

_SOURCE_KINDS: dict[str, SourceKind] = {"ha": "ha", "zigbee2mqtt": "zigbee2mqtt"}


def source_kind(key: DeviceKey) -> SourceKind:
    return _SOURCE_KINDS.get(key.source.partition(":")[0], "ha")


def source_name(key: DeviceKey) -> str:
    """The source's name as a DNS label (the part after the kind: a node id, a base topic)."""
    name = key.source.partition(":")[2].lower()
    cleaned = "".join(ch if ch.isalnum() and ch.isascii() else "-" for ch in name).strip("-")[:63].strip("-")
    return cleaned or "source"


def device_id_for(key: DeviceKey, _info: DeviceInfo | None = None) -> str:
    return make_device_id(key.source, key.identifier)


@dataclass(eq=False)
class Bridged:
    """One device as the bridge speaks for it: its derived contract and codec, and what its availability topics
    last said."""

    derived: Derived
    seen: dict[str, bool] = field(default_factory=dict)
    latest: bool | None = None

    @property
    def contract(self) -> Contract:
        return self.derived.contract

    @property
    def topics(self) -> Topics:
        return self.derived.topics

    @property
    def left_out(self) -> tuple[Any, ...]:
        return self.derived.left_out

    def command(self, actuator_id: str, value: Value) -> list[tuple[str, bytes]]:
        publish = self.derived.codec.command(actuator_id, value)
        return [(publish.topic, publish.payload)]

    def readings(self, topic: str, payload: bytes) -> dict[str, Value]:
        observed = self.derived.codec.read(topic, payload)
        return {**observed.readings, **observed.state}

    def matches(self, actuator_id: str) -> Any:
        codec = self.derived.codec
        return lambda observed, wanted: codec.confirms(actuator_id, wanted, observed)

    def availability(self, topic: str, payload: bytes) -> bool | None:
        availability = self.derived.codec.availability
        said = next((t.read(payload) for t in availability.topics if t.topic == topic), None)
        if said is None:
            return None
        self.seen[topic] = said
        self.latest = said
        return availability.online(self.seen, self.latest)


def derive(discovered: Discovered, device_id: str, risk: Mapping[str, str]) -> Bridged:
    return Bridged(derive_contract(discovered, risk, device_id=device_id))


class Catalog:
    def __init__(self, discovery_prefix: str = "homeassistant", z2m_base_topics: tuple[str, ...] = ("zigbee2mqtt",)
                 ) -> None:
        self.discovery_prefix = discovery_prefix
        self.z2m_base_topics = z2m_base_topics
        self._ha = discovery.Catalog(discovery_prefix)  # what each config topic last said
        self._z2m: dict[str, dict[DeviceKey, Discovered]] = {}  # base topic -> its devices
        self._ha_devices: dict[DeviceKey, Discovered] = {}
        self._optimistic: dict[str, tuple[bool | None, dict[str, bool]]] = {}  # base -> (default, per ieee)

    def subscriptions(self) -> list[str]:
        topics = [f"{self.discovery_prefix}/#"]
        for base in self.z2m_base_topics:
            topics += [f"{base}/bridge/devices", f"{base}/bridge/info"]
        return topics

    def read(self, topic: str, payload: bytes) -> set[DeviceKey]:
        """Take one message; the devices it changed (none for a topic that is not discovery)."""
        for base in self.z2m_base_topics:
            if topic == f"{base}/bridge/devices":
                return self._read_z2m(base, payload)
            if topic == f"{base}/bridge/info":
                self._read_info(base, payload)
                return set()
        if topic.startswith(f"{self.discovery_prefix}/") and topic.endswith("/config"):
            return self._read_ha(topic, payload)
        return set()

    def device(self, key: DeviceKey) -> Discovered | None:
        if key in self._ha_devices:
            return self._ha_devices[key]
        for devices in self._z2m.values():
            if key in devices:
                return devices[key]
        return None

    def find(self, device_id: str) -> Discovered | None:
        for discovered in [*self._ha_devices.values(), *(d for ds in self._z2m.values() for d in ds.values())]:
            if device_id_for(discovered.key) == device_id:
                return discovered
        return None

    def optimistic(self, key: DeviceKey) -> bool:
        """Whether the device's source echoes commands optimistically (zigbee2mqtt's default: yes)."""
        if source_kind(key) != "zigbee2mqtt":
            return False
        default, per_device = self._optimistic.get(key.source.partition(":")[2], (None, {}))
        said = per_device.get(key.identifier, default)
        return True if said is None else said

    # zigbee2mqtt -----------------------------------------------------------------------------

    def _read_z2m(self, base: str, payload: bytes) -> set[DeviceKey]:
        try:
            devices = {d.key: d for d in exposes.read_devices(payload, base)}
        except ValueError as err:  # not a list at all: keep what we had, never take it for "no devices"
            log.warning("zigbee2mqtt's %s/bridge/devices is unreadable: %s", base, err)
            return set()
        before = self._z2m.get(base, {})
        self._z2m[base] = devices
        return {key for key in {*before, *devices} if before.get(key) != devices.get(key)}

    def _read_info(self, base: str, payload: bytes) -> None:
        try:
            config = (json.loads(payload) or {}).get("config") or {}
        except (ValueError, AttributeError):
            return
        if not isinstance(config, dict):
            return
        default = (config.get("device_options") or {}).get("optimistic")
        per_device = {str(ieee): bool(options["optimistic"]) for ieee, options in (config.get("devices") or {}).items()
                      if isinstance(options, dict) and isinstance(options.get("optimistic"), bool)}
        self._optimistic[base] = (default if isinstance(default, bool) else None, per_device)

    # Home Assistant ------------------------------------------------------------------------------

    def _read_ha(self, topic: str, payload: bytes) -> set[DeviceKey]:
        changed = self._ha.update(topic, payload)
        for key in changed:
            found = self._ha.device(key)
            if found is None:
                self._ha_devices.pop(key, None)
            else:
                self._ha_devices[key] = found
        return changed

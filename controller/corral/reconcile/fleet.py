"""What the controller knows about each device from MQTT, and which Devices bind which device ids.

Two caches meet here: the device side (contract, online, reported state,
sensors) keyed by device id, and the Kubernetes side (Device objects from
the watch) indexed by `spec.deviceId`. Both are in memory; after a restart
the retained `info`/`status` messages and the watch fill them again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from corral.contract.model import Contract
from corral.devices.telemetry import EarlyWrites, SensorBuffer


@dataclass
class DeviceRuntime:
    device_id: str
    contract: Contract | None = None
    contract_error: str | None = None
    capability: str | None = None
    capability_ensured: bool = False
    online: bool | None = None
    last_seen: datetime | None = None
    reported: dict[str, Any] = field(default_factory=dict)
    # True once `reported` came from the device since it last came online.
    state_known: bool = False
    buffer: SensorBuffer = field(default_factory=SensorBuffer)
    # Actuators that reached their target for (uid, generation, epoch); a later difference is drift.
    reached_for: tuple[str, int, int] | None = None
    reached: set[str] = field(default_factory=set)
    command_epoch: int = 0
    failures: int = 0
    next_attempt: float = 0.0
    announced: set[str] = field(default_factory=set)  # one-off Event keys already posted
    sensors_written: dict[str, Any] = field(default_factory=dict)
    sensors_written_at: float = float("-inf")
    early_writes: EarlyWrites = field(default_factory=EarlyWrites)
    last_status: dict[str, Any] | None = None
    last_seen_written_at: float = float("-inf")
    registration_suppressed: bool = False

    def reached_set(self, key: tuple[str, int, int]) -> set[str]:
        if self.reached_for != key:
            self.reached_for = key
            self.reached = set()
        return self.reached


class DeviceCache:
    """Device objects as the watch delivers them, by (namespace, name) and by spec.deviceId."""

    def __init__(self) -> None:
        self._bodies: dict[tuple[str, str], dict[str, Any]] = {}
        self._by_device_id: dict[str, set[tuple[str, str]]] = {}

    def upsert(self, body: dict[str, Any]) -> str | None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        self.remove(key)
        device_id = body.get("spec", {}).get("deviceId")
        self._bodies[key] = body
        if isinstance(device_id, str):
            self._by_device_id.setdefault(device_id, set()).add(key)
        return device_id if isinstance(device_id, str) else None

    def remove(self, key: tuple[str, str]) -> str | None:
        old = self._bodies.pop(key, None)
        if old is None:
            return None
        device_id = old.get("spec", {}).get("deviceId")
        keys = self._by_device_id.get(device_id, set())
        keys.discard(key)
        if not keys:
            self._by_device_id.pop(device_id, None)
        return device_id

    def get(self, key: tuple[str, str]) -> dict[str, Any] | None:
        return self._bodies.get(key)

    def bound(self, device_id: str) -> list[dict[str, Any]]:
        """Devices claiming device_id, oldest first (the oldest wins a duplicate claim)."""
        bodies = [self._bodies[k] for k in self._by_device_id.get(device_id, ())]
        return sorted(bodies, key=lambda b: (b["metadata"].get("creationTimestamp") or "", b["metadata"]["name"]))

"""What the controller knows about each device from MQTT: contract, online state, reported state, sensors.

In memory only; after a restart the retained `info` and `status` messages fill it again. Keyed by the
device id of the MQTT topics, which Devices bind through `spec.deviceId` (see `cache.DeviceCache`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from corral.contract.model import Contract
from corral.devices.telemetry import EarlyWrites, SensorBuffer

# Statuses of devices whose contract has not arrived yet, kept until it does (MQTT orders messages per
# topic only, so `status` may come before `info`). Bounded: a flood of ids that never announce a contract
# must not grow the controller without limit.
MAX_PENDING_STATUSES = 10_000


@dataclass
class StatusMemory:
    """When parts of the status were last written: what the coalescing rules need to remember."""

    sensors_written: dict[str, Any] = field(default_factory=dict)
    sensors_written_at: float = float("-inf")
    early_writes: EarlyWrites = field(default_factory=EarlyWrites)
    last_seen_written_at: float = float("-inf")


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
    # Consecutive command timeouts or refusals, and when the next attempt may go out.
    failures: int = 0
    next_attempt: float = 0.0
    announced: set[str] = field(default_factory=set)  # one-off Event keys already posted
    memory: StatusMemory = field(default_factory=StatusMemory)
    registration_suppressed: bool = False

    def reached_set(self, key: tuple[str, int, int]) -> set[str]:
        if self.reached_for != key:
            self.reached_for = key
            self.reached = set()
        return self.reached

    def report(self, state: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        """Take the device's full state as reported; what changed, actuator -> (before, after)."""
        self.state_known = True
        if state == self.reported:
            return {}
        before, self.reported = self.reported, dict(state)
        return {k: (before.get(k), v) for k, v in state.items() if before.get(k) != v}

    @property
    def announced_contract(self) -> bool:
        """Whether the device has said who it is (a contract, accepted or refused)."""
        return self.contract is not None or self.contract_error is not None


class Fleet:
    """Every device heard of, by device id, and the statuses of devices not yet known."""

    def __init__(self) -> None:
        self.devices: dict[str, DeviceRuntime] = {}
        self._pending_status: OrderedDict[str, bytes] = OrderedDict()

    def get(self, device_id: str) -> DeviceRuntime | None:
        return self.devices.get(device_id)

    def values(self) -> list[DeviceRuntime]:
        return list(self.devices.values())

    def add(self, device_id: str) -> DeviceRuntime:
        rt = self.devices[device_id] = DeviceRuntime(device_id)
        return rt

    def keep_status(self, device_id: str, payload: bytes) -> None:
        """Remember the latest status of a device that has not announced its contract yet."""
        self._pending_status[device_id] = payload
        self._pending_status.move_to_end(device_id)
        while len(self._pending_status) > MAX_PENDING_STATUSES:
            self._pending_status.popitem(last=False)

    def take_status(self, device_id: str) -> bytes | None:
        return self._pending_status.pop(device_id, None)

    @property
    def pending_statuses(self) -> int:
        return len(self._pending_status)

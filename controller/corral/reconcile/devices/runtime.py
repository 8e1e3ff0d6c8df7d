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
from corral.devices.messages import FailsafeReport, MaxOnReport
from corral.devices.telemetry import EarlyWrites, SensorBuffer

# The latest `info` and `status` of device ids the controller does not drive yet: an id no Device binds
# (enrolled a moment later, on a broker Corral does not manage), or one whose status came before its
# contract (MQTT orders messages per topic only). Bounded in number and bytes: a flood of junk ids costs
# nothing beyond these bounds, and makes no Device and no Capability.
MAX_PENDING = 4096
MAX_PENDING_BYTES = 16 * 1024 * 1024


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
    capability: str | None = None  # the Capability of the announced contract
    capability_ensured: bool = False
    # What the controller trusts (contract.trust): the accepted Capability, for the Device of this uid, and
    # why the announced contract waits for a person (empty: it does not).
    accepted_capability: str | None = None
    accepted_for: str | None = None
    hold: tuple[str, ...] = ()
    hold_reason: str = ""  # the ContractAccepted condition's reason while held (contract.trust.Acceptance)
    online: bool | None = None
    online_at: float = float("-inf")  # time.monotonic() of the last `online` the device said itself
    last_seen: datetime | None = None
    reported: dict[str, Any] = field(default_factory=dict)
    # True once `reported` came from the device since it last came online.
    state_known: bool = False
    # Actuators the firmware moved to their failsafe value (heartbeat lost), as its last full report said.
    failsafe: dict[str, FailsafeReport] = field(default_factory=dict)
    # Actuators the firmware switched off by their on-time limit (max_on_seconds), as its last full report said.
    max_on: dict[str, MaxOnReport] = field(default_factory=dict)
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
    """Every device the controller drives, by device id, and the last words of ids it does not drive yet."""

    def __init__(self) -> None:
        self.devices: dict[str, DeviceRuntime] = {}
        self._pending: OrderedDict[tuple[str, str], bytes] = OrderedDict()  # (device id, kind) -> payload
        self._pending_bytes = 0

    def get(self, device_id: str) -> DeviceRuntime | None:
        return self.devices.get(device_id)

    def values(self) -> list[DeviceRuntime]:
        return list(self.devices.values())

    def add(self, device_id: str) -> DeviceRuntime:
        rt = self.devices[device_id] = DeviceRuntime(device_id)
        return rt

    def keep(self, device_id: str, kind: str, payload: bytes) -> None:
        """Remember the latest message of this kind from a device id the controller does not drive yet."""
        key = (device_id, kind)
        old = self._pending.pop(key, None)
        if old is not None:
            self._pending_bytes -= len(old)
        self._pending[key] = payload
        self._pending_bytes += len(payload)
        while len(self._pending) > MAX_PENDING or self._pending_bytes > MAX_PENDING_BYTES:
            _, dropped = self._pending.popitem(last=False)
            self._pending_bytes -= len(dropped)

    def take(self, device_id: str, kind: str) -> bytes | None:
        payload = self._pending.pop((device_id, kind), None)
        if payload is not None:
            self._pending_bytes -= len(payload)
        return payload

    @property
    def pending(self) -> int:
        return len(self._pending)

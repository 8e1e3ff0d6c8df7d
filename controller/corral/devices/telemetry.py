"""Telemetry in memory, and when it is worth a status write.

Kubernetes is not a time-series database: samples live in a bounded ring
buffer per device and metric (served as readings, cited as evidence), and `status.sensors` gets the latest values at most once
per interval, sooner only when a value moves beyond the deadband (and even
then not more often than the minimum gap, so a noisy sensor cannot turn into
a write storm), and never when nothing changed.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from corral.contract.model import Sensor
from corral.devices.messages import Sample, StateValue

# Samples kept per device and metric: five minutes at 1 Hz. Memory per sample is two 8-byte array slots
# plus the value's slot and the value itself (none for a bool or a small int): 50-58 bytes, 46 MiB for
# 1,000 devices of three metrics (bench/readings.py --memory-only).
DEFAULT_CAPACITY = 300
# A device names its metrics; one that invents new names cannot make the controller keep more rings.
MAX_METRICS = 32


@dataclass(frozen=True)
class Reading:
    """One sample as the controller holds it: the device's own `ts` (what an agent cites) and when the
    controller received it, by the controller's clock (what freshness is measured with: device clocks drift)."""

    metric: str
    value: StateValue
    ts: int  # device clock, Unix epoch milliseconds
    received_ms: float  # controller clock, Unix epoch milliseconds


class MetricRing:
    """The newest `capacity` samples of one metric, in the order they arrived, in flat arrays."""

    __slots__ = ("_count", "_next", "_received", "_ts", "_values", "capacity", "metric")

    def __init__(self, metric: str, capacity: int = DEFAULT_CAPACITY) -> None:
        self.metric, self.capacity = metric, capacity
        self._ts = array("q", bytes(8 * capacity))
        self._received = array("d", bytes(8 * capacity))
        self._values: list[StateValue] = [False] * capacity
        self._next = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, ts: int, received_ms: float, value: StateValue) -> None:
        i = self._next
        self._ts[i], self._received[i], self._values[i] = ts, received_ms, value
        self._next = (i + 1) % self.capacity
        self._count = min(self._count + 1, self.capacity)

    def _reading(self, i: int) -> Reading:
        return Reading(self.metric, self._values[i], self._ts[i], self._received[i])

    def _at(self, offset: int) -> int:
        """The array position of the offset-th sample kept, 0 the oldest."""
        return (self._next - self._count + offset) % self.capacity

    def newest(self) -> Reading | None:
        return self._reading(self._at(self._count - 1)) if self._count else None

    def since(self, received_ms: float) -> list[Reading]:
        """Samples received at or after this time, oldest first."""
        out = []
        for offset in range(self._count - 1, -1, -1):
            i = self._at(offset)
            if self._received[i] < received_ms:
                break
            out.append(self._reading(i))
        out.reverse()
        return out

    def first_with_ts(self, ts: int) -> Reading | None:
        """The first arrival of a sample with this device ts: a device that sends an old ts again does not make
        it fresh."""
        for offset in range(self._count):
            i = self._at(offset)
            if self._ts[i] == ts:
                return self._reading(i)
        return None


@dataclass
class SensorBuffer:
    """Recent samples of one device, a ring per metric; `latest` holds the newest sample (by device ts) of each."""

    capacity: int = DEFAULT_CAPACITY
    rings: dict[str, MetricRing] = field(default_factory=dict)
    latest: dict[str, Reading] = field(default_factory=dict)

    def add(self, sample: Sample, received_ms: float) -> None:
        ring = self.rings.get(sample.metric)
        if ring is None:
            if len(self.rings) >= MAX_METRICS:
                return
            ring = self.rings[sample.metric] = MetricRing(sample.metric, self.capacity)
        ring.add(sample.ts, received_ms, sample.value)
        current = self.latest.get(sample.metric)
        if current is None or sample.ts >= current.ts:
            self.latest[sample.metric] = Reading(sample.metric, sample.value, sample.ts, received_ms)


@dataclass(frozen=True)
class Coalescing:
    interval_s: float = 10.0
    min_gap_s: float = 2.0
    # Fraction of a sensor's declared range; sensors without a range use the absolute fallback.
    deadband_fraction: float = 0.02
    deadband_absolute: float = 0.5
    # Absolute deadbands per metric, for sensors noisier than their range suggests (e.g. rssi).
    deadbands: dict[str, float] = field(default_factory=dict)
    # Early writes (before the interval, for a change beyond the deadband) need a token from a budget of
    # this many, refilled one per interval, and every write spends one: a sudden change shows at once,
    # yet a sensor that jumps every second costs no more than one write per interval.
    early_burst: int = 2

    def deadband(self, metric: str, sensor: Sensor | None) -> float:
        if metric in self.deadbands:
            return self.deadbands[metric]
        if sensor is not None and sensor.range is not None:
            return (sensor.range.max - sensor.range.min) * self.deadband_fraction
        return self.deadband_absolute

    def should_write(
        self,
        written: dict[str, object],
        current: dict[str, object],
        seconds_since_write: float,
        sensors: dict[str, Sensor],
        early_budget: float = float("inf"),
    ) -> bool:
        """written/current map metric -> value; True when current deserves a status write now.

        early_budget: what EarlyWrites.available() says is left for writes before the interval.
        """
        if current == written:
            return False
        if seconds_since_write >= self.interval_s:
            return True
        if seconds_since_write < self.min_gap_s or early_budget < 1:
            return False
        for metric, value in current.items():
            before = written.get(metric)
            if before is None or type(before) is not type(value):
                return True
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if abs(value - before) > self.deadband(metric, sensors.get(metric)):  # type: ignore[operator]  # same type, checked above
                    return True
            elif value != before:
                return True
        return False


@dataclass
class EarlyWrites:
    """One device's budget of early sensor writes (see Coalescing.early_burst): a token bucket."""

    tokens: float = -1.0  # -1: full, set on first use
    at: float = 0.0

    def available(self, rule: Coalescing, now: float) -> float:
        if self.tokens < 0:
            return float(rule.early_burst)
        return min(float(rule.early_burst), self.tokens + (now - self.at) / rule.interval_s)

    def spend(self, rule: Coalescing, now: float) -> None:
        self.tokens, self.at = max(0.0, self.available(rule, now) - 1), now

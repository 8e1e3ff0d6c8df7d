"""Telemetry in memory, and when it is worth a status write.

Kubernetes is not a time-series database: samples live in a bounded ring
buffer per device, and `status.sensors` gets the latest values at most once
per interval, sooner only when a value moves beyond the deadband (and even
then not more often than the minimum gap, so a noisy sensor cannot turn into
a write storm), and never when nothing changed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from corral.contract.model import Sensor
from corral.devices.messages import Sample

DEFAULT_BUFFER = 256


@dataclass
class SensorBuffer:
    """Recent samples of one device, oldest dropped first."""

    capacity: int = DEFAULT_BUFFER
    samples: deque[Sample] = field(default_factory=deque)
    latest: dict[str, Sample] = field(default_factory=dict)

    def add(self, sample: Sample) -> None:
        if len(self.samples) >= self.capacity:
            self.samples.popleft()
        self.samples.append(sample)
        current = self.latest.get(sample.metric)
        if current is None or sample.ts >= current.ts:
            self.latest[sample.metric] = sample


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

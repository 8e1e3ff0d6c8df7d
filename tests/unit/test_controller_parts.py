"""Small parts of the controller: sensor coalescing, the work queue, conditions."""

from __future__ import annotations

import asyncio

from corral.contract.model import Sensor
from corral.devices.telemetry import Coalescing, SensorBuffer
from corral.devices.messages import Sample
from corral.reconcile import conditions
from corral.reconcile.workqueue import WorkQueue

TEMP = Sensor.model_validate({"metric": "temperature", "unit": "°C", "range": {"min": -40, "max": 85}})


def test_no_write_when_nothing_changed_even_after_the_interval() -> None:
    rule = Coalescing(interval_s=10)
    assert not rule.should_write({"temperature": 21.0}, {"temperature": 21.0}, 3600, {"temperature": TEMP})


def test_small_changes_wait_for_the_interval_and_big_ones_do_not() -> None:
    rule = Coalescing(interval_s=10, deadband_fraction=0.02)  # 2.5 °C on a 125 °C range
    sensors = {"temperature": TEMP}
    assert not rule.should_write({"temperature": 21.0}, {"temperature": 22.0}, 3, sensors)
    assert rule.should_write({"temperature": 21.0}, {"temperature": 22.0}, 10, sensors)
    assert rule.should_write({"temperature": 21.0}, {"temperature": 24.0}, 3, sensors)
    assert rule.should_write({}, {"temperature": 21.0}, 0, sensors)


def test_sensor_buffer_is_bounded_and_keeps_the_newest_value() -> None:
    buffer = SensorBuffer(capacity=3)
    for ts in (5, 1, 6, 7, 8):
        buffer.add(Sample(metric="t", value=float(ts), ts=ts))
    assert [s.ts for s in buffer.samples] == [6, 7, 8]
    assert buffer.latest["t"].ts == 8


def test_work_queue_deduplicates_and_requeues_keys_changed_while_active() -> None:
    async def scenario() -> list[str]:
        queue = WorkQueue()
        queue.add("a")
        queue.add("a")
        queue.add("b")
        first = await queue.get()
        queue.add(first)  # changed while being handled
        queue.done(first)
        return [await queue.get(), await queue.get()]

    assert asyncio.run(scenario()) == ["b", "a"]


def test_condition_transition_time_moves_only_when_status_changes() -> None:
    before = [{"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "T0"}]
    same = conditions.merge(before, [conditions.condition("Ready", "True", "Ready", "still", 2)], "T1")
    flipped = conditions.merge(before, [conditions.condition("Ready", "False", "Offline", "gone", 2)], "T1")
    assert same[0]["lastTransitionTime"] == "T0" and flipped[0]["lastTransitionTime"] == "T1"

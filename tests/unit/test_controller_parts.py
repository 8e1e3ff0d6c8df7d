"""Small parts of the controller: sensor coalescing, the work queue, conditions."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from corral.contract.model import Sensor
from corral.devices.commands import CommandTimeout, CommandTracker
from corral.devices.messages import Ack, Sample
from corral.devices.telemetry import MAX_METRICS, Coalescing, EarlyWrites, SensorBuffer
from corral.kube import conditions
from corral.kube.workqueue import WorkQueue
from corral.reconcile.devices.targets import owned_target as _owned_target

TEMP = Sensor.model_validate({"metric": "temperature", "unit": "°C", "range": {"min": -40, "max": 85}})


def test_no_write_when_nothing_changed_even_after_the_interval() -> None:
    rule = Coalescing(interval_s=10)
    assert not rule.should_write({"temperature": 21.0}, {"temperature": 21.0}, 3600, {"temperature": TEMP})


def test_small_changes_wait_for_the_interval_and_big_ones_only_for_the_minimum_gap() -> None:
    rule = Coalescing(interval_s=10, min_gap_s=2, deadband_fraction=0.02)  # 2.5 °C on a 125 °C range
    sensors = {"temperature": TEMP}
    assert not rule.should_write({"temperature": 21.0}, {"temperature": 22.0}, 3, sensors)
    assert rule.should_write({"temperature": 21.0}, {"temperature": 22.0}, 10, sensors)
    assert rule.should_write({"temperature": 21.0}, {"temperature": 24.0}, 3, sensors)
    assert not rule.should_write({"temperature": 21.0}, {"temperature": 24.0}, 1, sensors)
    assert rule.should_write({}, {"temperature": 21.0}, 2, sensors)


def test_per_metric_deadbands_override_the_range_fraction() -> None:
    rule = Coalescing(interval_s=10, deadbands={"temperature": 5.0})
    assert not rule.should_write({"temperature": 21.0}, {"temperature": 24.0}, 3, {"temperature": TEMP})


def test_sensor_buffer_is_bounded_and_keeps_the_newest_value() -> None:
    buffer = SensorBuffer(capacity=3)
    for received, ts in enumerate((5, 1, 6, 7, 8)):
        buffer.add(Sample(metric="t", value=float(ts), ts=ts), received_ms=1000.0 + received)
    assert [r.ts for r in buffer.rings["t"].since(0)] == [6, 7, 8]
    assert buffer.latest["t"].ts == 8 and buffer.latest["t"].received_ms == 1004.0
    assert [r.ts for r in buffer.rings["t"].since(1003.0)] == [7, 8]
    assert buffer.rings["t"].first_with_ts(1) is None  # pushed out


def test_sensor_buffer_dates_a_resent_sample_by_its_first_arrival() -> None:
    buffer = SensorBuffer(capacity=8)
    buffer.add(Sample(metric="t", value=1.0, ts=100), received_ms=5000.0)
    buffer.add(Sample(metric="t", value=1.0, ts=100), received_ms=9000.0)  # replayed later
    found = buffer.rings["t"].first_with_ts(100)
    assert found is not None and found.received_ms == 5000.0


def test_sensor_buffer_keeps_no_more_metrics_than_its_limit() -> None:
    buffer = SensorBuffer(capacity=2)
    for n in range(MAX_METRICS + 5):
        buffer.add(Sample(metric=f"m{n}", value=n, ts=n), received_ms=float(n))
    assert len(buffer.rings) == MAX_METRICS and "m40" not in buffer.latest


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
    t0, t1 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC), datetime(2026, 12, 1, 10, 5, tzinfo=UTC)
    before = conditions.merge([], [conditions.Wanted("Ready", "True", "Ready", "", 1)], t0)
    same = conditions.merge(before, [conditions.Wanted("Ready", "True", "Ready", "still", 2)], t1)
    flipped = conditions.merge(before, [conditions.Wanted("Ready", "False", "Offline", "gone", 2)], t1)
    assert same[0].last_transition_time == t0 and flipped[0].last_transition_time == t1


def test_an_ack_resolves_only_the_command_of_the_device_it_came_from() -> None:
    async def scenario() -> tuple[str, bool]:
        tracker = CommandTracker()
        sent: list[dict] = []
        waiting = asyncio.ensure_future(tracker.send("fan-1", sent.append, {"id": "c-1"}, timeout_s=2))
        await asyncio.sleep(0)
        foreign = tracker.resolve("light-1", Ack(id="c-1", ok=True, state={"power": True}))
        assert tracker.resolve("fan-1", Ack(id="c-1", ok=True, state={"fan": "high"}))
        ack = await waiting
        return ack.state["fan"], foreign

    assert asyncio.run(scenario()) == ("high", False)


def test_a_missing_ack_times_out_and_leaves_nothing_behind() -> None:
    async def scenario() -> int:
        tracker = CommandTracker()
        try:
            await tracker.send("fan-1", lambda _p: None, {"id": "c-2"}, timeout_s=0.05)
        except CommandTimeout:
            return tracker.in_flight
        raise AssertionError("no timeout")

    assert asyncio.run(scenario()) == 0


def test_intents_repeat_the_target_fields_they_already_own_so_apply_does_not_drop_them() -> None:
    device = {
        "metadata": {"managedFields": [
            {"manager": "corral-intents", "operation": "Apply",
             "fieldsV1": {"f:spec": {"f:target": {"f:fan": {}, "f:gone": {}}}}},
            {"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:spec": {"f:target": {"f:light": {}}}}},
        ]},
        "spec": {"target": {"fan": "high", "light": True}},
    }
    assert _owned_target(device, "corral-intents") == {"fan": "high"}


def test_a_sensor_jumping_every_second_costs_at_most_one_write_per_interval_after_a_short_burst() -> None:
    """The status-write budget at 1 Hz telemetry with every change beyond the deadband."""
    rule = Coalescing(interval_s=10, min_gap_s=2, early_burst=2)
    sensors = {"temperature": TEMP}
    budget, written, written_at, writes = EarlyWrites(), {"temperature": 0.0}, -100.0, []
    for second in range(600):  # ten minutes
        current = {"temperature": 60.0 if second % 2 else 10.0}
        if rule.should_write(written, current, second - written_at, sensors, budget.available(rule, second)):
            budget.spend(rule, second)
            written, written_at = current, second
            writes.append(second)
    per_minute = len([w for w in writes if w >= 60]) / 9
    assert per_minute <= 6.0, per_minute
    assert writes[1] - writes[0] <= rule.min_gap_s + 1, "a sudden change still shows within the minimum gap"

"""A device's message limit (a token bucket), a burst's few reports, and the kubelet's Event correlator."""

from __future__ import annotations

import pytest

from corral.devices.limits import BurstReports, DeviceLimits, TokenBucket
from corral.kube.correlate import COMBINED_PREFIX, EventCorrelator, EventKey


def test_a_bucket_allows_its_burst_at_once_then_its_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=20)
    assert sum(bucket.take(0.0) for _ in range(100)) == 20
    assert not bucket.take(0.1)
    assert bucket.take(0.5), "one token back after half a second at 2/s"
    assert not bucket.take(0.5)
    assert sum(bucket.take(100.0) for _ in range(100)) == 20, "refilled, never above the burst"


def test_a_bucket_refuses_a_rate_or_burst_that_means_nothing() -> None:
    with pytest.raises(ValueError, match="rate above 0"):
        TokenBucket(rate=0, burst=5)
    with pytest.raises(ValueError, match="burst of at least 1"):
        DeviceLimits(rate=1, burst=0)


def test_a_burst_is_told_at_its_start_each_minute_while_it_lasts_and_at_its_end() -> None:
    burst = BurstReports(quiet_s=5, interval_s=60, max_reports=3)
    reports = [r for t in range(0, 150) for r in [burst.drop(float(t))] if r is not None]
    assert [(r.phase, r.dropped) for r in reports] == [("started", 1), ("continuing", 60), ("continuing", 60)]
    assert burst.tick(150.0) is None, "not quiet for long enough yet"
    end = burst.tick(154.0)
    assert end is not None and (end.phase, end.dropped, end.total) == ("ended", 29, 150)
    assert sum(r.dropped for r in [*reports, end]) == 150, "every drop is counted in some report"
    assert burst.tick(200.0) is None and burst.next_tick() is None


def test_bursts_in_quick_succession_still_get_at_most_three_reports_a_minute() -> None:
    burst = BurstReports(quiet_s=1, interval_s=60, max_reports=3)
    told: list[tuple[float, str, int]] = []
    for second in range(0, 120, 2):  # a drop every other second: each one a new burst after 1 s of quiet
        for now in (float(second), second + 1.5):
            report = burst.drop(now) if now == second else burst.tick(now)
            if report is not None:
                told.append((now, report.phase, report.dropped))
    for start, _, _ in told:
        assert sum(1 for t, _, _ in told if start <= t < start + 60) <= 3, told
    # Nothing is lost: what could not be told when it happened is in a later report.
    while (when := burst.next_tick()) is not None:
        report = burst.tick(when)
        if report is not None:
            told.append((when, report.phase, report.dropped))
    assert sum(dropped for _, _, dropped in told) == 60
    assert told[-1][1] == "ended"


def test_device_limits_are_per_device() -> None:
    limits = DeviceLimits(rate=1, burst=3, quiet_s=5)
    results = [limits.admit("flood", 0.0) for _ in range(10)]
    assert [taken for taken, _ in results] == [True] * 3 + [False] * 7
    assert [r.phase for _, r in results if r is not None] == ["started"]
    assert limits.admit("quiet", 0.0) == (True, None), "another device keeps its own bucket"
    assert limits.next_tick() == 5.0
    assert [(d, r.phase, r.total) for d, r in limits.tick(5.0)] == [("flood", "ended", 7)]


KEY = EventKey("Device", "home", "lamp", "uid-1", "StateChanged", "Normal")


def test_events_of_one_object_get_the_kubelets_burst_then_one_per_five_minutes() -> None:
    correlator = EventCorrelator()
    posted = [correlator.correlate(KEY, "same note", 0.0) for _ in range(40)]
    assert sum(note is not None for note in posted) == 25
    assert correlator.correlate(KEY, "same note", 299.0) is None
    assert correlator.correlate(KEY, "same note", 301.0) == "same note"


def test_a_flood_of_one_reason_does_not_silence_another_reason_on_the_same_object() -> None:
    correlator = EventCorrelator()
    for _ in range(100):
        correlator.correlate(KEY, "state", 0.0)
    warning = EventKey("Device", "home", "lamp", "uid-1", "Flooding", "Warning")
    assert correlator.correlate(warning, "Over the limit", 0.0) == "Over the limit"
    other = EventKey("Device", "home", "other-lamp", "uid-2", "StateChanged", "Normal")
    assert correlator.correlate(other, "state", 0.0) == "state", "other objects keep their own bucket"


def test_similar_events_are_combined_after_ten_different_notes() -> None:
    correlator = EventCorrelator(burst=100)
    notes = [correlator.correlate(KEY, f"power -> {i}", float(i)) for i in range(12)]
    assert notes[:9] == [f"power -> {i}" for i in range(9)]
    assert notes[9] == COMBINED_PREFIX + "power -> 9"
    assert notes[11] == COMBINED_PREFIX + "power -> 11"
    assert correlator.correlate(KEY, "power -> 1", 11.0 + 601) == "power -> 1", "combining ends after 10 quiet min"

"""Freshness that fits the device: the limit from a sensor's declared interval, capped, overridden by a person;
a lengthened interval held like any widening; the refusal naming the limit and the next sample; the gateway's
wait_for_fresh_s choosing what to cite."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from corral.contract.diff import wording_changes
from corral.contract.freshness import FreshnessRule
from corral.contract.model import Contract
from corral.contract.trust import judge, widenings
from corral.decide.decision import DeviceFacts, IntentFacts, Policy, decide
from corral.decide.evidence import Evidence, Observation, Received
from corral.gateway import fresh
from corral.gateway.visible import VisibleDevice
from corral_fw.device import DEFAULT_TELEMETRY_MS
from corral_sim import catalog

NOW = datetime(2026, 12, 2, 9, 0, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)
RULE = FreshnessRule(default_s=2.0, cap_s=60.0)


def contract(interval_s: float | None = 5.0, **sensor: Any) -> Contract:
    declared = {} if interval_s is None else {"interval_s": interval_s}
    return Contract.model_validate({
        "device_id": "bedroom-fan", "name": "Fan", "model": "corral-env-fan", "fw": "1.0.0",
        "sensors": [{"metric": "temperature", "unit": "°C", **declared, **sensor}],
        "actuators": [{"id": "fan", "name": "Fan", "type": "enum", "values": ["off", "high"], "action": "set_mode",
                       "risk": "low", "level": "write"}],
    })


def test_the_limit_is_two_and_a_half_intervals_capped_by_the_cluster_and_a_person_overrides_it() -> None:
    assert RULE.limit_s(5.0) == 12.5, "a 5 s device's sample may be cited for 12.5 s"
    assert RULE.limit_s(0.5) == 1.25
    assert RULE.limit_s(3600.0) == 60.0, "a long declared interval cannot make an hour-old reading fresh"
    assert RULE.limit_s(None) == 2.0, "no interval: the cluster's default"
    assert RULE.limit_s(5.0, override_s=300.0) == 300.0, "a person's spec.freshness is theirs to set"


@pytest.mark.parametrize("interval", [0.05, 0, -1, 86401])
def test_an_interval_out_of_bounds_is_refused_saying_what_is_allowed(interval: float) -> None:
    with pytest.raises(ValidationError) as err:
        contract(interval)
    assert "interval_s" in str(err.value) and ("0.1" in str(err.value) or "86400" in str(err.value))


def test_a_lengthened_interval_is_held_and_a_shortened_one_is_not() -> None:
    accepted = contract(5.0)
    assert widenings(accepted, contract(30.0), RULE) == [
        "sensor temperature: interval lengthened (5 -> 30 s: older readings would count as fresh)"]
    # Held even where the cap hides it today: a later, higher cap would otherwise trust it silently.
    assert widenings(contract(30.0), contract(60.0), RULE) != []
    assert widenings(accepted, contract(1.0), RULE) == [], "positive control: a shorter interval needs nobody"
    verdict = judge(contract(30.0), "cap-b", accepted, "cap-a", None, False, RULE)
    assert verdict.accepted == "cap-a" and verdict.hold
    assert judge(contract(1.0), "cap-b", accepted, "cap-a", None, False, RULE).accepted == "cap-b"


def test_migrating_contracts_without_intervals_held_only_when_readings_would_count_as_fresh_longer() -> None:
    old = contract(None)
    # 0.5 s declared: 1.25 s, within the 2 s the sensor already had: accepted by itself.
    assert widenings(old, contract(0.5), RULE) == []
    # 5 s declared: 12.5 s instead of 2 s: a person accepts it once (corral devices accept-contract).
    assert widenings(old, contract(5.0), RULE) == [
        "sensor temperature: interval declared (5 s): readings would count as fresh for 12.5 s instead of 2 s"]
    # A cluster whose default is already as long sees no widening.
    assert widenings(old, contract(5.0), FreshnessRule(default_s=15.0)) == []
    # The interval is judged here, not as a change of wording.
    assert wording_changes(contract(5.0), contract(30.0)) == []
    assert wording_changes(contract(5.0), contract(5.0, description="new words")) != []


def intent_citing(ts: int) -> IntentFacts:
    return IntentFacts(uid="u1", name="fan-1", device="bedroom-fan", actuator="fan", action="set_mode", value="high",
                       requester="agent", created_at=NOW - timedelta(seconds=1),
                       based_on=(Observation("temperature", ts),))


def evidence(cited_at_ms: float, newest: tuple[int, float] | None = None, interval: float | None = 5.0,
             override: float | None = None) -> Evidence:
    key = ("bedroom-fan", "temperature")
    newest_sample = Received(*(newest or (1000, cited_at_ms)), 24.0)
    return Evidence({("bedroom-fan", "temperature", 1000): Received(1000, cited_at_ms, 23.5)}, {key: newest_sample},
                    intervals={key: interval} if interval is not None else {},
                    overrides={key: override} if override is not None else {})


def judged(ev: Evidence, interval: float | None = 5.0) -> Any:
    device = DeviceFacts(exists=True, device_id="bedroom-fan", contract=contract(interval), online=True)
    return decide(intent_citing(1000), device, True, [], "h" * 64, NOW, Policy(), evidence=ev)


def test_a_sample_of_a_five_second_sensor_is_good_for_twelve_and_a_half_seconds() -> None:
    assert judged(evidence(NOW_MS - 12_500)).outcome == "execute", "just inside the limit"
    stale = judged(evidence(NOW_MS - 12_600))
    assert stale.code == "DENY_SENSOR"
    assert "received within 12.5 s (2.5 x the 5 s publish interval its contract declares)" in stale.message
    # The cited sample is the freshest there is: the message says when the next one is due, not "read again" alone.
    assert "It is the freshest sample the controller has" in stale.message
    assert "The next sample is due at 08:59:52.4 UTC (7.6 s ago, so it is late)" in stale.message


def test_the_refusal_names_the_next_sample_due_in_the_future() -> None:
    # Cited 13 s ago, a newer sample came 2 s ago: the next is due in 3 s.
    refused = judged(evidence(NOW_MS - 13_000, newest=(2000, NOW_MS - 2000)))
    assert refused.code == "DENY_SENSOR"
    assert "The freshest sample the controller has is ts=2000" in refused.message
    assert "The next sample is due at 09:00:03.0 UTC (in 3.0 s)" in refused.message


def test_without_an_interval_the_default_holds_and_a_persons_override_replaces_the_limit() -> None:
    refused = judged(evidence(NOW_MS - 2500, interval=None), interval=None)
    assert refused.code == "DENY_SENSOR" and "within 2 s (the cluster's default" in refused.message
    assert "declares no publish interval, so when the next one comes is unknown" in refused.message
    assert judged(evidence(NOW_MS - 1500, interval=None), interval=None).outcome == "execute"
    capped = judged(evidence(NOW_MS - 61_000, interval=3600.0), interval=3600.0)
    assert capped.code == "DENY_SENSOR" and "within 60 s (the cluster's cap" in capped.message
    assert judged(evidence(NOW_MS - 61_000, override=120.0)).outcome == "execute"
    overridden = judged(evidence(NOW_MS - 121_000, override=120.0))
    assert "within 120 s (set for this Device by a person, spec.freshness)" in overridden.message


def test_every_catalog_sensor_declares_the_interval_the_firmware_publishes_at() -> None:
    for device_type in catalog.catalog_files():
        data = catalog.contract_for(device_type)
        for sensor in data.get("sensors", []):
            assert sensor.get("interval_s") == DEFAULT_TELEMETRY_MS / 1000, f"{device_type}/{sensor['metric']}"


# The gateway's wait_for_fresh_s ------------------------------------------------------------------------------

FAN = VisibleDevice("home", "bedroom-fan", {"spec": {"deviceId": "bedroom-fan"}}, contract(5.0),
                    frozenset({"read", "listen", "write"}))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def cite(samples: list[dict[str, Any] | None], wait_s: float, clock: Clock, device: VisibleDevice = FAN
         ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """freshen over a sensor whose newest sample is each of `samples` in turn, the clock moving 1 s a look."""
    def by_id(_: str) -> VisibleDevice | None:
        return None

    async def latest(_: VisibleDevice, __: str) -> dict[str, Any] | None:
        clock.now += 1.0
        return samples.pop(0) if len(samples) > 1 else samples[0]

    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return await fresh.freshen([{"metric": "temperature", "ts": 1000}], device, by_id, latest, wait_s, clock)
    return asyncio.run(run())


def test_wait_for_fresh_cites_a_newer_sample_or_waits_for_the_due_one_and_no_longer_than_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fresh, "POLL_S", 0)  # the test's clock moves by itself
    overtaken = cite([{"ts": 6000, "value": 24.0, "age_s": 0.4}], 5, Clock())
    assert overtaken[0] == [{"metric": "temperature", "ts": 6000}]
    assert overtaken[1][0] == {"device_id": "home/bedroom-fan", "metric": "temperature", "ts": 6000, "value": 24.0,
                               "replaced": True}
    # Positive control: the cited sample is the newest and younger than its interval: cited as is, no wait.
    clock = Clock()
    kept = cite([{"ts": 1000, "value": 23.5, "age_s": 1.0}], 5, clock)
    assert kept[0] == [{"metric": "temperature", "ts": 1000}] and not kept[1][0]["replaced"] and clock.now == 1
    # Due (older than 5 s): waits for the next one.
    clock = Clock()
    waited = cite([{"ts": 1000, "value": 23.5, "age_s": 5.5}, {"ts": 1000, "value": 23.5, "age_s": 6.5},
                   {"ts": 6000, "value": 24.0, "age_s": 0.1}], 5, clock)
    assert waited[0] == [{"metric": "temperature", "ts": 6000}] and clock.now == 3
    # None comes in time: the original citation stands (the controller decides), after at most the wait asked.
    clock = Clock()
    late = cite([{"ts": 1000, "value": 23.5, "age_s": 9.0}], 2, clock)
    assert late[0] == [{"metric": "temperature", "ts": 1000}] and clock.now <= 3
    # A caller without listen on the device gets exactly what it cited.
    blind = VisibleDevice("home", "bedroom-fan", FAN.body, FAN.contract, frozenset({"read", "write"}))
    assert cite([{"ts": 6000, "value": 24.0, "age_s": 0.1}], 5, Clock(), blind)[0] == [
        {"metric": "temperature", "ts": 1000}]


@pytest.mark.parametrize("bad", [-1, 10.5, "5", True])
def test_wait_for_fresh_is_bounded_and_says_so(bad: object) -> None:
    with pytest.raises(fresh.WaitError, match="wait_for_fresh_s must be a number of seconds from 0 to 10"):
        fresh.wait_of({"wait_for_fresh_s": bad})
    assert fresh.wait_of({}) == 0 and fresh.wait_of({"wait_for_fresh_s": 10}) == 10

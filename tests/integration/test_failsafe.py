"""The failsafe end to end: real firmware, real Mosquitto, real API server, `corral run` as a process.

A simulated SHT30 whose heater has a failsafe of `false` after 3 s (its catalog contract says 30 s) is turned
on through its Device's target. Then the controller goes away: SIGKILLed (the broker publishes its Will at
once) and, separately, SIGSTOPped (a hung controller: no beats and no Will). Either way the heater goes off
by itself 3 s after the last heartbeat it heard, not before, and says why; when the controller is back it
drives the heater on again, through the interlocks, and not at all for a target older than
--redrive-max-age. Times come from the fleet's own record of what its hardware applied and when, and from a
watcher's record of when each heartbeat arrived: both are time.monotonic() of this process.
"""

from __future__ import annotations

import copy
import itertools
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes
import pytest

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.devcluster.plane import Plane
from corral_sim.catalog import contract_for
from corral_sim.fleet import Fleet
from tests.broker_harness import device_accounts, observer
from tests.controller_harness import ControllerProcess, device, events, set_target
from tests.fleet_harness import Message, Watcher, enroll_devices, hardware_applies_at, retained, running_fleet
from tests.harness import fresh_namespace, wait_for
from tests.mqtt5_harness import Account, client, granted

pytestmark = [pytest.mark.integration, pytest.mark.alone]  # its failsafe delays are timed: not beside another worker

SENSOR = "bath-climate"
SPARE = "spare-sensor"  # enrolled, never connected: an account to attack the heartbeat with
DELAY_S = 3.0
INTERVAL_S = 0.5
# The device hears a beat a moment before or after the watcher does (both are subscribers of one broker).
SKEW_S = 0.05
NOT_AUTHORIZED = 0x87


def short_failsafe() -> dict[str, Any]:
    contract = copy.deepcopy(contract_for("sht30"))
    for actuator in contract["actuators"]:
        if actuator["id"] == "heater":
            actuator["failsafe"] = {"value": False, "delay_s": DELAY_S}
    return contract


@dataclass
class Site:
    plane: Plane
    admin: kubernetes.client.ApiClient
    namespace: str
    prefix: str
    fleet: Fleet
    watcher: Watcher
    controller: ControllerProcess
    passwords: dict[str, str]

    def status(self) -> dict[str, Any]:
        return device(self.admin, self.namespace, SENSOR).get("status") or {}

    def condition(self, kind: str) -> dict[str, Any]:
        return next((c for c in self.status().get("conditions") or [] if c["type"] == kind), {})

    def heater(self) -> list[tuple[Any, float]]:
        """What the heater's hardware was told, with when."""
        return [(value, at) for actuator, value, at in hardware_applies_at(self.fleet, SENSOR) if actuator == "heater"]

    def beats(self) -> list[Message]:
        return [m for m in self.watcher.messages("_corral", "heartbeat") if not m.retain and "seq" in m.json()]

    def beating(self) -> None:
        """Beats are coming (a controller that has just started may not have sent its second one yet)."""
        count = len(self.beats())
        self.watcher.wait_for("two more heartbeats", lambda: len(self.beats()) >= count + 2, timeout_s=5)

    def wills(self, since: float) -> list[Message]:
        return [m for m in self.watcher.messages("_corral", "heartbeat") if m.at >= since
                and m.json().get("state") == "gone"]

    def failsafe_events(self, since: float) -> list[dict[str, Any]]:
        return [m.json() for m in self.watcher.messages(SENSOR, "event") if m.at >= since
                and m.json().get("value") == "failsafe"]

    def event_notes(self, reason: str) -> list[str]:
        return [e.note for e in events(self.admin, self.namespace, SENSOR) if e.reason == reason]

    def set_anew(self) -> None:
        """What a person does to have the heater driven on again: another target first, then on again (an apply
        that changes nothing is nothing to the API server), each seen by the controller."""
        for value in (False, True):
            set_target(self.admin, self.namespace, SENSOR, {"heater": value})
            generation = device(self.admin, self.namespace, SENSOR)["metadata"]["generation"]
            wait_for(lambda generation=generation: self.status().get("observedGeneration") == generation,
                     f"the controller to see generation {generation}", timeout_s=10)

    def heater_on(self) -> None:
        set_target(self.admin, self.namespace, SENSOR, {"heater": True})
        wait_for(lambda: self.status().get("reported", {}).get("heater") is True and self.status().get("inSync"),
                 "the heater on and in sync", timeout_s=15)


@pytest.fixture(scope="module")
def site(plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Site]:
    prefix = f"fs-{uuid.uuid4().hex[:8]}"
    logs = tmp_path_factory.mktemp("failsafe")
    with fresh_namespace(corral_api, "failsafe") as namespace:
        passwords = enroll_devices(corral_api, namespace, {SENSOR: "sht30", SPARE: "sht30"})
        device_accounts(plane, prefix, passwords)
        watcher = Watcher(plane, prefix)
        with running_fleet(plane, prefix, {SENSOR: "sht30"}, credentials={SENSOR: passwords[SENSOR]},
                           contracts={SENSOR: short_failsafe()}) as fleet:
            # An account of its own: a test elsewhere on this plane with the shared controller account would take
            # over this one's session now and then, and each takeover fires its Will.
            username, password = observer(plane, "controller")
            controller = ControllerProcess(plane, namespace, prefix, logs / "controller.log",
                                           "--heartbeat-interval", str(INTERVAL_S),
                                           mqtt_url=f"mqtt://{username}:{password}@127.0.0.1:{plane.mqtt_port}")
            controller.start()
            try:
                wait_for(lambda: (device(corral_api, namespace, SENSOR).get("status") or {}).get("online"),
                         "the sensor online", timeout_s=30)
                yield Site(plane, corral_api, namespace, prefix, fleet, watcher, controller, passwords)
            finally:
                controller.stop()
                watcher.close()


def fails_safe_after_its_delay(site: Site, gone_at: float, applies_before: int) -> None:
    """The heater stays on until DELAY_S after the last beat it heard, then goes off by itself, once."""
    time.sleep(0.2)  # any beat still on its way arrives (beats go out every INTERVAL_S; none after gone_at)
    last_beat = max(m.at for m in site.beats())
    assert last_beat <= gone_at + SKEW_S
    # The deliberate observation point: shortly before the delay has passed, the heater is still on.
    time.sleep(max(0.0, last_beat + DELAY_S - 0.4 - time.monotonic()))
    assert site.heater()[applies_before:] == [], "the heater was switched before its delay"
    off = wait_for(lambda: site.heater()[applies_before:], "the heater's failsafe", timeout_s=DELAY_S + 5)
    assert [value for value, _ in off] == [False], "exactly one failsafe apply: off"
    off_at = off[0][1]
    seen = (f"; beats seen at {[round(m.at - gone_at, 3) for m in site.beats()[-4:]]} s from the loss, "
            f"failsafe events {site.failsafe_events(gone_at)}")
    assert off_at - last_beat >= DELAY_S - SKEW_S, f"off {off_at - last_beat:.3f} s after the last beat{seen}"
    assert off_at - last_beat <= DELAY_S + 0.5, f"off only {off_at - last_beat:.3f} s after the last beat{seen}"


def driven_on_again(site: Site, applies_before: int) -> None:
    wait_for(lambda: [v for v, _ in site.heater()[applies_before:]] == [False, True], "the heater driven on again",
             timeout_s=20)
    wait_for(lambda: site.status().get("reported", {}).get("heater") is True and site.status().get("inSync"),
             "the Device in sync again", timeout_s=15)
    wait_for(lambda: site.condition("Failsafe").get("reason") == "Cleared", "condition Failsafe cleared",
             timeout_s=10)


def test_a_killed_controllers_will_and_the_heater_off_after_its_delay_then_on_again_when_it_is_back(
        site: Site) -> None:
    site.heater_on()
    epoch = site.status().get("commandEpoch") or 0
    applies_before = len(site.heater())
    site.beating()
    killed_at = time.monotonic()  # before: the broker may publish the Will before kill() has reaped the process
    site.controller.kill()
    site.watcher.wait_for("the controller's Will", lambda: site.wills(killed_at), timeout_s=5)

    fails_safe_after_its_delay(site, killed_at, applies_before)
    event = site.watcher.wait_for("the failsafe state event", lambda: site.failsafe_events(killed_at))[0]
    assert event["state"]["heater"] is False
    cause = event["failsafe"]["heater"]
    assert (cause["value"], cause["controller"]) == (False, "gone")
    assert DELAY_S * 1000 <= cause["heartbeat_lost_ms"] <= (DELAY_S + 0.5) * 1000

    site.controller.start()
    driven_on_again(site, applies_before)
    assert (site.status().get("commandEpoch") or 0) == epoch + 1, "a re-drive: a new epoch, a new command id"
    note = wait_for(lambda: site.event_notes("Failsafe"), "the Failsafe Event")[-1]
    assert "heater -> false after 3." in note and "Last Will said it was gone" in note
    # Back, the controller replaced its Will: a device booting now is not told of a death that is over.
    assert retained(site.plane, f"{site.prefix}/_corral/heartbeat").json()["state"] == "alive"


def test_a_hung_controller_sends_no_will_the_heater_goes_off_all_the_same_and_back_on_through_the_interlocks(
        site: Site) -> None:
    objects = kubernetes.client.CustomObjectsApi(site.admin)
    interlock = {"apiVersion": API_VERSION, "kind": "Interlock", "metadata": {"name": "no-heater"},
                 "spec": {"guards": {"devices": [SENSOR], "actuators": ["heater"], "values": [True]},
                          "condition": "false", "message": "The heater stays off during the test."}}
    site.heater_on()
    applies_before = len(site.heater())
    # In force at the controller before it hangs: when it carries on, the re-drive meets it.
    objects.create_namespaced_custom_object(GROUP, VERSION, site.namespace, "interlocks", interlock)
    wait_for(lambda: [i["name"] for i in site.status().get("interlocks") or []] == ["no-heater"],
             "the Interlock known to the controller", timeout_s=15)
    site.beating()
    frozen_at = time.monotonic()
    site.controller.freeze()
    try:
        fails_safe_after_its_delay(site, frozen_at, applies_before)
        event = site.watcher.wait_for("the failsafe state event", lambda: site.failsafe_events(frozen_at))[0]
        heard = [(round(m.at - frozen_at, 2), m.retain, m.payload) for m in site.watcher.messages("_corral", "heartbeat")
                 if m.json().get("state") == "gone" or m.retain]
        assert event["failsafe"]["heater"]["controller"] == "silent", heard
        assert site.wills(frozen_at) == [], "a hung controller's connection is open: no Will (yet)"
    finally:
        site.controller.thaw()

    held = wait_for(lambda: site.condition("Interlocked").get("status") == "True" and site.condition("Interlocked"),
                    "the re-drive held by the Interlock", timeout_s=15)
    assert "no-heater" in held["message"]
    note = wait_for(lambda: site.event_notes("Failsafe"), "the Failsafe Event")[-1]
    assert "its heartbeats stopped" in note
    assert [v for v, _ in site.heater()[applies_before:]] == [False], "not driven against the Interlock"
    assert site.condition("Failsafe")["status"] == "True"

    objects.delete_namespaced_custom_object(GROUP, VERSION, site.namespace, "interlocks", "no-heater")
    wait_for(lambda: not site.status().get("interlocks"), "the Interlock gone at the controller", timeout_s=15)
    site.set_anew()  # a held target stays held until it changes
    driven_on_again(site, applies_before)


def test_after_a_failsafe_a_target_older_than_the_redrive_age_is_not_driven_until_a_person_sets_it_anew(
        site: Site) -> None:
    site.heater_on()
    applies_before = len(site.heater())
    time.sleep(2.0)  # with the failsafe's 3 s, older than --redrive-max-age 4 once the controller is back
    site.beating()
    killed_at = time.monotonic()  # before: the broker may publish the Will before kill() has reaped the process
    site.controller.kill()
    fails_safe_after_its_delay(site, killed_at, applies_before)
    extra = site.controller.extra
    # managedFields times have whole seconds: a target set anew looks up to 1 s old, well below 4 s (it must be acted on within the 3 s left).
    site.controller.extra = (*extra, "--redrive-max-age", "4")
    try:
        site.controller.start()
        failsafe = wait_for(lambda: site.condition("Failsafe").get("reason") == "TargetTooOld"
                            and site.condition("Failsafe"), "condition Failsafe TargetTooOld", timeout_s=15)
        assert "spec.target.heater=true was set" in failsafe["message"]
        assert "--redrive-max-age" in failsafe["message"]
        assert site.condition("InSync")["reason"] == "FailsafeTargetTooOld"
        wait_for(lambda: site.event_notes("FailsafeTargetTooOld"), "the FailsafeTargetTooOld Event")
        assert [v for v, _ in site.heater()[applies_before:]] == [False], "not driven again by itself"

        site.set_anew()
        driven_on_again(site, applies_before)
    finally:
        site.controller.extra = extra


def test_a_device_account_cannot_publish_on_the_heartbeat_topic(site: Site) -> None:
    topic = f"{site.prefix}/_corral/heartbeat"
    with client(site.plane.mqtt_port, Account(SPARE, site.passwords[SPARE])) as spare:
        assert granted(spare.connect())
        assert granted(spare.subscribe(topic)), "devices may read the heartbeat"
        beat = json.dumps({"state": "alive", "seq": 1, "ts": 0}).encode()
        assert spare.publish(topic, beat).value == NOT_AUTHORIZED
        assert spare.publish(topic, b'{"state": "gone"}', retain=True).value == NOT_AUTHORIZED



def test_beats_come_every_interval_and_a_clean_stop_leaves_gone_in_place_of_the_will(site: Site) -> None:
    beats = sorted(m.at for m in site.beats())
    gaps = sorted(b - a for a, b in itertools.pairwise(beats))
    assert INTERVAL_S * 0.8 <= gaps[len(gaps) // 2] <= INTERVAL_S * 1.6, f"median gap {gaps[len(gaps) // 2]:.3f} s"
    assert site.controller.stop() == 0
    farewell = retained(site.plane, f"{site.prefix}/_corral/heartbeat").json()
    assert farewell["state"] == "gone" and farewell["ts"] > 0, "a clean DISCONNECT discards the Will: said itself"


def test_a_failsafe_delay_of_too_few_heartbeats_is_a_warning_on_the_device(site: Site) -> None:
    """Last in this module: it restarts the controller with a slower heartbeat (the heater may fail safe)."""
    assert not site.event_notes("FailsafeTooSoon"), f"a {DELAY_S} s delay is {DELAY_S / INTERVAL_S:g} beats: enough"
    site.controller.stop()
    extra = site.controller.extra
    site.controller.extra = (*extra, "--heartbeat-interval", "1.5")  # two beats in the heater's delay
    try:
        site.controller.start()
        notes = wait_for(lambda: site.event_notes("FailsafeTooSoon"), "the FailsafeTooSoon Event", timeout_s=15)
        assert "heater after 3 s" in notes[0] and "every 1.5 s" in notes[0], notes
    finally:
        site.controller.extra = extra

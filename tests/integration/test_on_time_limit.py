"""The on-time limit end to end: real firmware, real Mosquitto, real API server, `corral run` as a process.

A simulated relay whose firmware was built with `max_on_seconds: 5` (the catalog relay says 4 h: the simulator
builds a device from a modified contract, as a vendor would build firmware with its own limit; a lower limit is
a narrowing, so the controller trusts it by itself) is switched on through its Device's target. Then the
controller is SIGSTOPped (a hung controller: it sends nothing, heartbeats included) and the relay goes off by
itself LIMIT_S after it went on, by the firmware's own clock. Once the controller runs again, the Device says the
limit acted (condition OnTimeLimit, an Event, an audit record) and the relay is not switched on again by the
target that still says on. Times come from the fleet's own record of what its hardware applied and when, and
from a watcher's record of when each message arrived: both are time.monotonic() of this process.
"""

from __future__ import annotations

import copy
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from corral.audit.log import read_records
from corral.devcluster.plane import Plane
from corral_sim.catalog import contract_for
from corral_sim.fleet import Fleet
from tests.broker_harness import device_accounts, observer
from tests.controller_harness import ControllerProcess, device, events, set_target
from tests.fleet_harness import Watcher, enroll_devices, hardware_applies_at, running_fleet
from tests.harness import fresh_namespace, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.alone]  # a timed limit: not beside another worker

RELAY = "heater-plug"
LIMIT_S = 5.0
INTERVAL_S = 0.5  # the controller's heartbeat: beats every half second while it runs, none while it is stopped
# The fleet's timers fire a few ms late; the watcher hears of an apply a moment after the hardware.
LATE_S = 1.0


def short_limit() -> dict[str, Any]:
    contract = copy.deepcopy(contract_for("relay"))
    for actuator in contract["actuators"]:
        if actuator["id"] == "relay":
            actuator["max_on_seconds"] = LIMIT_S
    return contract


def process_state(pid: int) -> str:
    """The kernel's word for the process: R, S, ... and T while it is stopped by a signal."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@dataclass
class Site:
    admin: kubernetes.client.ApiClient
    namespace: str
    fleet: Fleet
    watcher: Watcher
    controller: ControllerProcess

    def status(self) -> dict[str, Any]:
        return device(self.admin, self.namespace, RELAY).get("status") or {}

    def condition(self, kind: str) -> dict[str, Any]:
        return next((c for c in self.status().get("conditions") or [] if c["type"] == kind), {})

    def relay(self) -> list[tuple[Any, float]]:
        """What the relay's hardware was told, with when."""
        return [(value, at) for actuator, value, at in hardware_applies_at(self.fleet, RELAY) if actuator == "relay"]

    def beats(self, since: float) -> list[float]:
        return [m.at for m in self.watcher.messages("_corral", "heartbeat")
                if m.at >= since and not m.retain and "seq" in m.json()]


@pytest.fixture(scope="module")
def site(plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Site]:
    prefix = f"lim-{uuid.uuid4().hex[:8]}"
    logs = tmp_path_factory.mktemp("on-time-limit")
    with fresh_namespace(corral_api, "on-time-limit") as namespace:
        passwords = enroll_devices(corral_api, namespace, {RELAY: "relay"})
        device_accounts(plane, prefix, passwords)
        watcher = Watcher(plane, prefix)
        with running_fleet(plane, prefix, {RELAY: "relay"}, credentials=passwords,
                           contracts={RELAY: short_limit()}) as fleet:
            # An account of its own, as in test_failsafe.py: no other test's controller takes its session over.
            username, password = observer(plane, "controller")
            controller = ControllerProcess(plane, namespace, prefix, logs / "controller.log",
                                           "--heartbeat-interval", str(INTERVAL_S),
                                           mqtt_url=f"mqtt://{username}:{password}@127.0.0.1:{plane.mqtt_port}")
            controller.start()
            try:
                wait_for(lambda: (device(corral_api, namespace, RELAY).get("status") or {}).get("online"),
                         "the relay online", timeout_s=30)
                yield Site(corral_api, namespace, fleet, watcher, controller)
            finally:
                controller.stop()
                watcher.close()


def test_a_relay_with_max_on_seconds_turns_itself_off_with_the_controller_stopped(site: Site) -> None:
    assert site.relay() == [], "off since boot"
    set_target(site.admin, site.namespace, RELAY, {"relay": True})
    wait_for(lambda: site.status().get("reported", {}).get("relay") is True and site.status().get("inSync"),
             "the relay on and in sync", timeout_s=10)
    site.controller.freeze()
    frozen_at = time.monotonic()
    try:
        ((value, on_at),) = site.relay()
        assert value is True
        assert frozen_at < on_at + LIMIT_S - 1, "stopped well before the limit, or this proves nothing"
        assert process_state(site.controller.pid) == "T"

        off = wait_for(lambda: [(v, at) for v, at in site.relay() if v is False], "the relay off by itself",
                       timeout_s=LIMIT_S + 3)
        assert process_state(site.controller.pid) == "T", "the controller was still stopped when it went off"
        ((_, off_at),) = off
        assert LIMIT_S - 0.05 <= off_at - on_at <= LIMIT_S + LATE_S, f"off {off_at - on_at:.2f} s after on"
        print(f"\n[figure] relay with a {LIMIT_S} s limit, controller stopped: off {off_at - on_at:.2f} s after on")
        # Beats every 0.5 s while it runs: none from the moment it stopped to the moment the relay went off.
        assert site.beats(frozen_at + 0.1) == []
        said = site.watcher.wait_for("the device's word", lambda: [m.json() for m in site.watcher.messages(RELAY, "event")
                                                                    if m.json().get("value") == "max_on"])
        assert said[-1]["state"]["relay"] is False
        record = said[-1]["max_on"]["relay"]
        assert record["value"] is False and record["max_on_s"] == LIMIT_S
        assert LIMIT_S * 1000 <= record["on_ms"] <= (LIMIT_S + LATE_S) * 1000
        assert site.status().get("reported", {}).get("relay") is True, "nobody told the API server yet"
    finally:
        site.controller.thaw()

    condition = wait_for(lambda: site.condition("OnTimeLimit").get("status") == "True" and site.condition("OnTimeLimit"),
                         "condition OnTimeLimit", timeout_s=10)
    assert condition["reason"] == "LimitReached"
    said_limit = r"relay -> false after 5\.\d s on \(its on-time limit is 5\.0 s\)"
    assert re.search(said_limit, condition["message"]), condition["message"]
    assert "spec.target.relay=true is not driven again by itself" in condition["message"]
    status = site.status()
    assert status["reported"]["relay"] is False and status["inSync"] is False
    in_sync = next(c for c in status["conditions"] if c["type"] == "InSync")
    assert in_sync["reason"] == "OnTimeLimit"
    # The target still says on, and the controller has planned since it ran again: it did not undo the limit.
    assert [v for v, _ in site.relay()] == [True, False]
    notes = wait_for(lambda: [e.note for e in events(site.admin, site.namespace, RELAY) if e.reason == "OnTimeLimit"],
                     "the OnTimeLimit Event")
    assert len(notes) == 1 and re.fullmatch(f"The device switched {said_limit} by itself\\.", notes[0]), notes
    records = wait_for(lambda: [r for r in read_records(site.controller.audit_dir) if r.kind == "device.max_on"],
                       "the limit on record")
    assert records[-1].data["actuator"] == "relay" and records[-1].data["max_on_s"] == LIMIT_S
    assert records[-1].data["deviceId"] == RELAY

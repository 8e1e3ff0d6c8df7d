"""A compromised enrolled device, with its own credentials, against the controller: floods and refused topics.

Finding 4: 10,000 `event` messages from one device became 10,000 signed audit records and thousands of Events.
Now each device has a token bucket at ingest: what is over it is counted and told in a few records and
Warnings, and another device is driven as fast as before. Finding 9: the broker's refusals (a device
publishing on another's topics) left no trace an operator reads; now one record and one Warning Event per
burst say who tried whose topics how often.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes
import paho.mqtt.client as mqtt
import pytest

from corral.audit.chain import AuditRecord
from corral.audit.log import read_records
from corral.devcluster.plane import Plane
from corral.devcluster.processes import free_port
from corral.devices.limits import DEFAULT_BURST, DEFAULT_RATE
from corral_sim.catalog import contract_for
from tests.broker_harness import connected, device_accounts
from tests.controller_harness import ControllerProcess, device, events, set_target
from tests.fleet_harness import enroll_devices, running_fleet
from tests.harness import fresh_namespace, scrape, wait_for

# alone: the other device's pace is compared before and during the flood, which a second worker's load would sway.
pytestmark = [pytest.mark.integration, pytest.mark.alone]

NOISY, CALM, VICTIM = "noisy-lamp", "calm-lamp", "victim-lock"


@dataclass
class Site:
    plane: Plane
    api: kubernetes.client.ApiClient
    namespace: str
    prefix: str
    controller: ControllerProcess
    passwords: dict[str, str]  # the compromised device's own credentials (device id -> password)
    metrics_port: int  # the controller's /metrics

    def as_noisy(self) -> mqtt.Client:
        """A connection with the noisy lamp's credentials (one at a time: the broker's client id is the username)."""
        return connected(self.plane, NOISY, self.passwords[NOISY], protocol=mqtt.MQTTv5)

    def records(self, name: str, kind: str | None = None) -> list[AuditRecord]:
        return [r for r in read_records(self.controller.audit_dir)
                if r.subject == f"{self.namespace}/{name}" and (kind is None or r.kind == kind)]

    def warnings(self, name: str, reason: str) -> list[Any]:
        return [e for e in events(self.api, self.namespace, name) if e.reason == reason and e.type == "Warning"]


@pytest.fixture(scope="module")
def site(plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Site]:
    prefix = f"flood-{int(time.time() * 1000) % 10**8}"
    with fresh_namespace(corral_api, "device floods") as namespace:
        passwords = enroll_devices(corral_api, namespace, {NOISY: "light", VICTIM: "lock"})
        device_accounts(plane, prefix, passwords)
        with running_fleet(plane, prefix, {CALM: "light"}, enroll_in=(corral_api, namespace)):
            log = tmp_path_factory.mktemp("floods") / "controller.log"
            metrics_port = free_port()
            controller = ControllerProcess(plane, namespace, prefix, log, "--broker-log", str(plane.broker_log),
                                           "--metrics-port", str(metrics_port))
            controller.start()
            try:
                noisy = connected(plane, NOISY, passwords[NOISY], protocol=mqtt.MQTTv5)
                # What the device's firmware does on connect: its contract and `online`, retained.
                contract = {**contract_for("light"), "device_id": NOISY}
                noisy.publish(f"{prefix}/{NOISY}/info", json.dumps(contract), qos=1, retain=True).wait_for_publish(5)
                noisy.publish(f"{prefix}/{NOISY}/status", "online", qos=1, retain=True).wait_for_publish(5)
                noisy.disconnect()
                noisy.loop_stop()
                wait_for(lambda: (device(corral_api, namespace, CALM).get("status") or {}).get("inSync"),
                         "the calm lamp registered and in sync", timeout_s=30)
                # Registered, not online: it disconnected, and the controller reads that in the broker's log.
                wait_for(lambda: (device(corral_api, namespace, NOISY).get("status") or {}).get("capability"),
                         "the noisy lamp registered", timeout_s=30)
                yield Site(plane, corral_api, namespace, prefix, controller, passwords, metrics_port)
            finally:
                controller.stop()


# The compromised device's flood: a state report that changes every time, as the attacker sent (each one used to
# be a record and an Event), with QoS 1, at RATE a second (500 times its limit; steady, so the figure is the
# controller's, not a backlog of the two shared cores this runs on). Its password comes on stdin.
FLOOD_RATE = 1000
FLOOD = """
import json, sys, time
import paho.mqtt.client as mqtt
port, prefix, device_id, count, rate = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=device_id, protocol=mqtt.MQTTv5)
client.username_pw_set(device_id, sys.stdin.readline().strip())
client.connect("127.0.0.1", int(port))
client.loop_start()
start = time.monotonic()
for i in range(count):
    payload = {"ts": int(time.time() * 1000), "event": "state", "value": "local",
               "state": {"power": i % 2 == 0, "brightness": i % 100 + 1}}
    info = client.publish(f"{prefix}/{device_id}/event", json.dumps(payload), qos=1)
    if i % 100 == 99:
        info.wait_for_publish(10)
        time.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))
info.wait_for_publish(10)
client.disconnect()
client.loop_stop()
print(count)
"""


def _drive(site: Site, brightness: int) -> float:
    """Seconds from a person's new target for the calm lamp until its Device reports it."""
    start = time.monotonic()
    set_target(site.api, site.namespace, CALM, {"power": True, "brightness": brightness})
    wait_for(lambda: (device(site.api, site.namespace, CALM).get("status") or {}).get("reported", {})
             .get("brightness") == brightness, f"the calm lamp at brightness {brightness}", timeout_s=20,
             interval_s=0.02)
    return time.monotonic() - start


def test_a_flood_of_events_is_counted_not_recorded_and_other_devices_keep_their_pace(site: Site) -> None:
    baseline = [_drive(site, 10 + i) for i in range(7)]  # positive control: the path works, and how fast
    before = len(site.records(NOISY))
    sent = 10_000
    # From a process of its own, as a device would: in this one it would take the GIL from the measurements.
    flooding = subprocess.Popen([sys.executable, "-c", FLOOD, str(site.plane.mqtt_port), site.prefix, NOISY,
                                 str(sent), str(FLOOD_RATE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    assert flooding.stdin is not None
    flooding.stdin.write(site.passwords[NOISY].encode() + b"\n")  # never in its arguments
    flooding.stdin.close()
    started = time.monotonic()
    during = []
    while flooding.poll() is None or len(during) < 5:
        during.append(_drive(site, 40 + len(during) % 50))
    flood_s = time.monotonic() - started
    assert flooding.stdout is not None and flooding.stderr is not None
    out, err = flooding.stdout.read(), flooding.stderr.read()
    assert flooding.returncode == 0 and out.strip() == str(sent).encode(), err.decode()[-2000:]

    ended = wait_for(lambda: [r for r in site.records(NOISY, "device.flooding") if r.data["phase"] == "ended"],
                     "the flood's closing count", timeout_s=20)
    counted_s = time.monotonic() - started  # the controller may take the last messages after the flood was sent
    reports = site.records(NOISY, "device.flooding")
    assert reports[0].data["phase"] == "started" and len(reports) <= 3, [r.data for r in reports]
    dropped = ended[0].data["droppedInBurst"]
    taken = sent - dropped
    assert taken <= DEFAULT_BURST + DEFAULT_RATE * counted_s, f"{taken} of {sent} taken in {flood_s:.1f} s"
    assert sum(r.data["dropped"] for r in reports) == dropped, "every dropped message is in some report's count"
    records = len(site.records(NOISY)) - before
    # Beside one record per message taken: the flood's two reports, and the flooding process's connection and
    # disconnection (read from the broker's log, so its connection may land after `before` was counted).
    assert records <= 4 + taken, f"{records} records for {taken} messages taken and {dropped} dropped"
    assert scrape(site.metrics_port)['corral_device_messages_dropped_total{kind="event"}'] == dropped
    warnings = site.warnings(NOISY, "Flooding")
    assert 1 <= len(warnings) <= 3 and str(dropped) in warnings[-1].note, [w.note for w in warnings]
    # The rest of what the taken messages said, as the kubelet's recorder bounds an object's Events.
    assert len(events(site.api, site.namespace, NOISY)) <= 25 + 3 + 5
    assert statistics.median(during) <= 2 * statistics.median(baseline), (baseline, during)
    # Another device, under its limit, is untouched: nothing of it was dropped.
    assert not site.records(CALM, "device.flooding") and not site.warnings(CALM, "Flooding")


def test_a_device_publishing_on_another_devices_topics_leaves_one_record_and_one_warning_with_the_count(
        site: Site) -> None:
    own = f"{site.prefix}/{NOISY}/event"
    noisy = site.as_noisy()
    try:
        noisy.publish(own, json.dumps({"ts": int(time.time() * 1000), "event": "state",
                                       "state": {"power": True, "brightness": 77}}), qos=1).wait_for_publish(5)
        # Positive control: its own topic works (and it is under its limit again: the flood's bucket refilled).
        wait_for(lambda: (device(site.api, site.namespace, NOISY).get("status") or {}).get("reported", {})
                 .get("brightness") == 77, "the noisy lamp's own state report taken", timeout_s=20)
        for i in range(20):
            kind = ("event", "status", "ack", "info")[i % 4]
            noisy.publish(f"{site.prefix}/{VICTIM}/{kind}", b'{"ok": true}', qos=1).wait_for_publish(5)
    finally:
        noisy.disconnect()
        noisy.loop_stop()
    told = wait_for(lambda: site.records(NOISY, "device.refused"), "the refusals on record", timeout_s=15)
    assert len(told) == 1 and told[0].data["refused"] == 20 and told[0].data["targets"] == {VICTIM: 20}, told
    [warning] = wait_for(lambda: site.warnings(NOISY, "PublishRefused"), "the refusals told", timeout_s=10)
    assert f"Device {NOISY} tried to publish on {VICTIM}'s topics 20 times" in warning.note
    assert scrape(site.metrics_port)[f'corral_broker_refusals_total{{client="{NOISY}"}}'] == 20

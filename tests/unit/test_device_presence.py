"""Who the broker threw off: its log lines and its answers to account changes, and what the controller makes of them.

Pure parts only (the broker's words as Mosquitto 2.0.11 writes them); tests/integration/test_device_presence.py
runs the same against the real broker and API server.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from types import SimpleNamespace
from typing import Any

from corral.client.enroll import CREDENTIAL_TYPE, DEVICE_ID_LABEL, REVOKED_ANNOTATION
from corral.devices.accounts import disconnects
from corral.devices.link import Inbound
from corral.devices.presence import Presence, last_words, presence_of
from corral.devices.telemetry import Coalescing
from corral.devices.topics import Topics
from corral.kube.workqueue import WorkQueue
from corral.reconcile.devices.accounts import BrokerAccounts
from corral.reconcile.devices.driver import CommandTimeout, DeviceGone, Expectations
from corral.reconcile.devices.ingest import Ingest
from corral.reconcile.devices.runtime import Fleet

STAMP = "2026-12-02T08:09:40: "


def test_the_broker_log_lines_that_say_a_client_went_away_or_came() -> None:
    gone = [
        "Client light-1 disconnected.",
        "Client light-1 has been disconnected by administrative action.",
        "Client light-1 been disconnected by administrative action.",  # sic: Mosquitto 2.0.11's kick
        "Client light-1 closed its connection.",
        "Client light-1 has exceeded timeout, disconnecting.",
        "Socket error on client light-1, disconnecting.",
    ]
    for line in gone:
        assert presence_of(STAMP + line) == Presence("light-1", False, line), line
    came = "New client connected from 127.0.0.1:40312 as light-1 (p2, c1, k30, u'light-1')."
    assert presence_of("1764662980: " + came) == Presence("light-1", True, came)


def test_other_lines_and_takeovers_say_nothing() -> None:
    for line in ("Client light-1 already connected, closing old connection.",  # connected: the new one
                 "Denied PUBLISH from light-1 (d0, q1, r0, m5, 'home/lock-1/event', ... (2 bytes))",
                 "Received PINGREQ from light-1", "Client <unknown> disconnected, not authorised.",
                 "Client light-1 disconnected, not authorised.",  # anyone's login attempt with a device's id
                 "New connection from 127.0.0.1:40312 on port 1883."):
        assert presence_of(STAMP + line) is None, line


def test_a_client_name_in_the_log_is_device_text_made_safe() -> None:
    presence = presence_of(STAMP + "Client li\u202eght\u200b-1 disconnected.")
    assert presence is not None and presence.client == "light-1"


def test_the_last_word_per_client_wins() -> None:
    lines = [STAMP + "Client a disconnected.", STAMP + "New client connected from ::1:5 as a (p2, c1, k30, u'a').",
             STAMP + "New client connected from ::1:6 as b (p2, c1, k30, u'b').", STAMP + "Client b disconnected."]
    words = last_words(lines)
    assert {client: p.connected for client, p in words.items()} == {"a": True, "b": False}


def test_which_account_commands_throw_a_device_off() -> None:
    for command in ({"command": "disableClient", "username": "lock-1"}, {"command": "deleteClient", "username": "lock-1"},
                    {"command": "modifyClient", "username": "lock-1", "password": "x"},
                    {"command": "modifyRole", "rolename": "corral-device-lock-1", "acls": []}):
        assert (disconnects(command) or ("",))[0] == "lock-1", command
    for command in ({"command": "createClient", "username": "lock-1"}, {"command": "enableClient", "username": "x"},
                    {"command": "createRole", "rolename": "corral-device-lock-1"}, {"command": "listClients"},
                    {"command": "modifyRole", "rolename": "someone-elses-role"}):
        assert disconnects(command) is None, command


class _Link:
    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []

    def publish(self, topic: str, payload: dict[str, Any]) -> None:
        self.published.append(payload)


def _secret(name: str, device_id: str, revoked: bool, created: str) -> dict[str, Any]:
    annotations = {REVOKED_ANNOTATION: "2026-12-02T08:30:00Z"} if revoked else {}
    return {"metadata": {"name": name, "namespace": "home", "creationTimestamp": created, "annotations": annotations,
                         "labels": {DEVICE_ID_LABEL: device_id}},
            "type": CREDENTIAL_TYPE, "data": {"password": base64.b64encode(b"pw").decode()}}


def test_the_broker_answer_to_a_kicking_command_marks_the_device_gone_at_once() -> None:
    kicked: list[tuple[str, str]] = []

    async def run() -> None:
        link = _Link()
        accounts = BrokerAccounts(link, Topics("iot"), notices=None, limit_per_namespace=10,
                                  on_kicked=lambda device_id, why: kicked.append((device_id, why)))
        asking = asyncio.create_task(accounts._ask([{"command": "disableClient", "username": "lock-1"},
                                                    {"command": "enableClient", "username": "lamp-1"},
                                                    {"command": "deleteClient", "username": "gone-1"}]))
        await asyncio.sleep(0)
        tags = [c["correlationData"] for c in link.published[0]["commands"]]
        answer = {"responses": [{"command": "disableClient", "correlationData": tags[0]},
                                {"command": "enableClient", "correlationData": tags[1]},
                                {"command": "deleteClient", "correlationData": tags[2], "error": "Client not found"}]}
        accounts.on_response(json.dumps(answer).encode())
        assert kicked == [("lock-1", "its broker account was disabled (revoked)")], "told before anyone awaits"
        assert len(await asking) == 3

    asyncio.run(run())


def test_a_revoked_enrollment_bars_its_device_id_and_the_oldest_enrollment_decides() -> None:
    accounts = BrokerAccounts(_Link(), Topics("iot"), notices=None, limit_per_namespace=10)
    accounts.on_secret("ADDED", _secret("lock", "lock-1", False, "2026-12-02T08:00:00Z"))
    accounts.on_secret("ADDED", _secret("lamp", "lamp-1", False, "2026-12-02T08:00:00Z"))
    assert not accounts.barred("lock-1") and not accounts.barred("lamp-1")
    accounts.on_secret("MODIFIED", _secret("lock", "lock-1", True, "2026-12-02T08:00:00Z"))
    assert accounts.barred("lock-1") and not accounts.barred("lamp-1")
    # A second, newer enrollment of the same id makes no account (the oldest does): still barred.
    accounts.on_secret("ADDED", _secret("lock-again", "lock-1", False, "2026-12-02T09:00:00Z"))
    assert accounts.barred("lock-1")
    accounts.on_secret("DELETED", _secret("lock", "lock-1", True, "2026-12-02T08:00:00Z"))
    assert not accounts.barred("lock-1"), "the newer enrollment makes its account now"
    assert not accounts.barred("never-enrolled")


class _Notices:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []
        self.facts: list[tuple[str, str]] = []

    def post_for(self, device_id: str, reason: str, action: str, note: str, type_: str = "Normal") -> None:
        self.posted.append((device_id, reason, note))

    def fact(self, kind: str, device: str, data: dict[str, Any], trace: str | None = None) -> None:
        self.facts.append((kind, device))


def _ingest(barred: set[str]) -> tuple[Ingest, Fleet, _Notices]:
    fleet, notices = Fleet(), _Notices()
    ingest = Ingest(Topics("iot"), fleet, WorkQueue("devices"), driver=None, notices=notices,
                    coalescing=Coalescing(), bound=lambda device_id: True, trust=None,
                    barred=lambda device_id: device_id in barred)
    return ingest, fleet, notices


def _online(fleet: Fleet, device_id: str) -> bool | None:
    rt = fleet.get(device_id)
    assert rt is not None
    return rt.online


def _status(ingest: Ingest, device_id: str, word: str) -> None:
    ingest._on_status(ingest.fleet.get(device_id) or ingest.fleet.add(device_id), word.encode())


class _Devices:
    """The driver's get_state as devices answer it: those in `connected` ack, the others never do."""

    def __init__(self) -> None:
        self.connected: set[str] = set()
        self.asked: list[str] = []

    async def get_state(self, device_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        self.asked.append(device_id)
        if device_id in self.connected:
            return {}
        raise CommandTimeout(f"no ack within {timeout_s}s")


def _gone_line(device_id: str) -> dict[str, Presence]:
    return {device_id: Presence(device_id, False, f"Client {device_id} disconnected.")}


async def _settle(ingest: Ingest) -> None:
    while ingest._probes:
        await asyncio.gather(*ingest._probes.values())


def test_a_kicked_device_goes_offline_once_and_a_word_after_the_kick_wins() -> None:
    async def run() -> None:
        ingest, fleet, notices = _ingest(set())
        devices = _Devices()
        ingest.driver = devices
        _status(ingest, "lock-1", "online")
        assert _online(fleet, "lock-1") is True and notices.posted == [], "the first word after a start is no news"
        ingest.disconnected("lock-1", "its broker account was disabled (revoked)")
        ingest.on_broker_presence(_gone_line("lock-1"), time.monotonic())  # the same kick, in the log
        await _settle(ingest)
        assert _online(fleet, "lock-1") is False
        assert [(r, n) for _, r, n in notices.posted] == [
            ("Offline", "The device is offline: its broker account was disabled (revoked).")]
        assert notices.facts == [("device.disconnected", "lock-1")]
        assert devices.asked == [], "an offline device is not asked again"
        # It comes back (it has the new password) and says so; then a log line read from before that is applied.
        read_at = time.monotonic()
        _status(ingest, "lock-1", "online")
        ingest.on_broker_presence(_gone_line("lock-1"), read_at)
        await _settle(ingest)
        assert _online(fleet, "lock-1") is True, "a log line read before the device said online again is older news"
        assert [r for _, r, _ in notices.posted] == ["Offline", "Online"]
        # The positive control: read after its last word, the same line takes it offline (it does not answer).
        ingest.on_broker_presence(_gone_line("lock-1"), time.monotonic())
        await _settle(ingest)
        assert _online(fleet, "lock-1") is False
        assert "did not answer within 2 s" in notices.posted[-1][2], notices.posted[-1]
        ingest.disconnected("no-such-device", "anything")  # a client the controller does not drive: nothing

    asyncio.run(run())


def test_a_log_line_about_a_device_that_still_answers_is_not_believed() -> None:
    """Anyone may write a device's id into the broker's log (a login attempt with its client id): a device that
    answers a get_state stays online. The positive control: the same line about one that does not answer."""
    async def run() -> None:
        ingest, fleet, _ = _ingest(set())
        devices = _Devices()
        ingest.driver = devices
        for device_id in ("lamp-1", "lamp-2"):
            _status(ingest, device_id, "online")
        devices.connected.add("lamp-1")
        ingest.on_broker_presence({**_gone_line("lamp-1"), **_gone_line("lamp-2")}, time.monotonic())
        await _settle(ingest)
        assert _online(fleet, "lamp-1") is True and _online(fleet, "lamp-2") is False
        assert sorted(devices.asked) == ["lamp-1", "lamp-2"]

    asyncio.run(run())


def test_a_live_message_from_a_device_marked_offline_brings_it_back_unless_it_is_revoked() -> None:
    ingest, fleet, notices = _ingest({"lock-9"})
    ingest.driver = SimpleNamespace(expectations=Expectations())
    for device_id in ("lamp-1", "lock-9"):
        _status(ingest, device_id, "online")
        ingest.disconnected(device_id, "the broker logged it")
    telemetry = b'{"ts": 1764662980000, "samples": []}'
    ingest.on_message(Inbound("iot/lamp-1/telemetry", telemetry, retained=False))
    assert _online(fleet, "lamp-1") is True, "only a connected device can publish on its topics"
    assert "it sent a live telemetry message" in notices.posted[-1][2]
    ingest.on_message(Inbound("iot/lock-9/telemetry", telemetry, retained=False))
    assert _online(fleet, "lock-9") is False


def test_a_retained_online_of_a_revoked_device_is_an_old_word() -> None:
    ingest, fleet, _ = _ingest({"lock-1"})
    _status(ingest, "lock-1", "online")
    _status(ingest, "lamp-1", "online")
    assert _online(fleet, "lock-1") is False and _online(fleet, "lamp-1") is True


def test_a_revoked_device_s_waiting_command_ends_device_gone_and_a_rotated_one_s_keeps_waiting() -> None:
    async def run() -> None:
        barred: set[str] = set()
        ingest, _, _ = _ingest(barred)
        ingest.driver = SimpleNamespace(expectations=Expectations())
        revoked = ingest.driver.expectations.pin("lock-1", "locked", True, "c-1", "home/lock-up")
        rotated = ingest.driver.expectations.pin("lamp-1", "power", True, "c-2", "home/lamp-on")
        for device_id in ("lock-1", "lamp-1"):
            _status(ingest, device_id, "online")
        barred.add("lock-1")  # its enrollment revoked: the broker answers the disableClient next
        for device_id in ("lock-1", "lamp-1"):
            ingest.disconnected(device_id, "its broker account was changed")
        assert isinstance(revoked.future.exception(), DeviceGone)
        assert not rotated.future.done(), "a rotated device may come back with its new password and ack"
        rotated.future.cancel()

    asyncio.run(run())

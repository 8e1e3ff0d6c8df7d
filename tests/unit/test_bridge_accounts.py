"""The broker accounts of bridged sources and the bridge (devices.bridge_accounts), and how they join the plan."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from corral.client.bridge import BridgeError, as_label, parse_risks
from corral.devices.accounts import plan_accounts
from corral.devices.bridge_accounts import (
    BRIDGE_TYPE,
    SOURCE_TYPE,
    BridgeCredential,
    Bridged,
    Source,
    plan_bridge_accounts,
    secret_of,
)
from corral.devices.topics import Topics

TOPICS = Topics("iot")
Z2M = Source("home", "z2m", "zigbee2mqtt", "zigbee2mqtt", "zigbee2mqtt", "pw-z", created="2026-01-01T00:00:00Z")
NODE = Source("home", "porch", "ha", "porch-node", "porch-node", "pw-p", created="2026-01-02T00:00:00Z")
BRIDGE = BridgeCredential("home", "corral-bridge", "pw-b")
BULB = Bridged("home", "z2m-bulb", "z2m", ("zigbee2mqtt/bulb/set",), ("zigbee2mqtt/bulb",),
               ("zigbee2mqtt/bulb/availability",))


def rules(account: Any) -> set[tuple[str, str]]:
    return {(r["acltype"], r["topic"]) for r in account.rules}


def test_a_source_publishes_its_discovery_always_and_its_accepted_state_only() -> None:
    before = plan_bridge_accounts(TOPICS, [Z2M, NODE], [BRIDGE], [])
    assert rules(before.accounts["source.home.z2m"]) == {("publishClientSend", "zigbee2mqtt/bridge/#"),
                                                         ("subscribePattern", "zigbee2mqtt/#")}
    assert rules(before.accounts["source.home.porch"]) == {
        ("publishClientSend", "homeassistant/+/porch-node/+/config"),
        ("publishClientSend", "homeassistant/+/porch-node/config"),
        ("subscribePattern", "homeassistant/status"), ("subscribePattern", "porch-node/#")}
    after = plan_bridge_accounts(TOPICS, [Z2M, NODE], [BRIDGE], [BULB])
    assert {("publishClientSend", "zigbee2mqtt/bulb"), ("publishClientSend", "zigbee2mqtt/bulb/availability")} <= \
        rules(after.accounts["source.home.z2m"])
    assert ("publishClientSend", "zigbee2mqtt/bulb/set") not in rules(after.accounts["source.home.z2m"])
    assert rules(after.accounts["source.home.porch"]) == rules(before.accounts["source.home.porch"])


def test_the_bridge_speaks_for_its_accepted_devices_only() -> None:
    plan = plan_bridge_accounts(TOPICS, [Z2M, NODE], [BRIDGE], [BULB])
    bridge = rules(plan.accounts["corral-bridge"])
    publishes = {topic for kind, topic in bridge if kind == "publishClientSend"}
    assert publishes == {"zigbee2mqtt/bulb/set", "iot/z2m-bulb/info", "iot/z2m-bulb/status", "iot/z2m-bulb/ack",
                         "iot/z2m-bulb/telemetry"}
    listens = {topic for kind, topic in bridge if kind == "subscribePattern"}
    assert listens == {"zigbee2mqtt/bridge/#", "homeassistant/#", "zigbee2mqtt/bulb", "zigbee2mqtt/bulb/availability",
                       "iot/z2m-bulb/cmd", "iot/_corral/heartbeat"}
    presence = plan.accounts["corral-bridge.z2m-bulb"]
    assert presence.password == "pw-b" and rules(presence) == {("publishClientSend", "iot/z2m-bulb/status")}
    assert not plan.refused


def test_grants_outside_the_sources_root_or_from_unknown_sources_go_to_nobody() -> None:
    stray = Bridged("home", "stolen", "z2m", (), ("other/lock",), ())
    orphan = Bridged("home", "orphan", "nobody", (), ("zigbee2mqtt/x",), ())
    elsewhere = Bridged("away", "far", "z2m", (), ("zigbee2mqtt/far",), ())  # the source is of namespace home
    plan = plan_bridge_accounts(TOPICS, [Z2M], [BRIDGE], [stray, orphan, elsewhere])
    everything = set().union(*(rules(a) for a in plan.accounts.values()))
    assert not {t for _, t in everything} & {"other/lock", "zigbee2mqtt/x", "zigbee2mqtt/far"}
    assert len(plan.refused) == 3 and any("not under its source's topic root" in why for why in plan.refused)


def test_an_overlapping_newer_source_gets_no_account() -> None:
    newer = Source("other", "z2m-too", "zigbee2mqtt", "zigbee2mqtt/sub", "zigbee2mqtt/sub", "pw", created="2026-02-01")
    plan = plan_bridge_accounts(TOPICS, [Z2M, newer], [], [])
    assert "source.other.z2m-too" not in plan.accounts and "overlaps" in plan.refused[0]


def test_revoked_sources_are_disabled_and_the_plan_makes_roles_of_the_given_rules() -> None:
    revoked = Source("home", "z2m", "zigbee2mqtt", "zigbee2mqtt", "zigbee2mqtt", "pw-z", revoked=True)
    accounts = plan_bridge_accounts(TOPICS, [revoked], [], []).accounts
    commands = plan_accounts(TOPICS, accounts, [], [])
    assert [c["command"] for c in commands] == ["createRole", "createClient", "disableClient"]
    assert commands[0]["acls"] == list(accounts["source.home.z2m"].rules or ())
    # Gone from the wanted accounts (the Secret deleted): the client and its role are deleted.
    have = [{"username": "source.home.z2m", "textdescription": commands[1]["textdescription"], "roles": []}]
    gone = plan_accounts(TOPICS, {}, have, [{"rolename": commands[0]["rolename"], "acls": []}])
    assert [c["command"] for c in gone] == ["deleteClient", "deleteRole"]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_secrets_are_read_and_malformed_ones_ignored() -> None:
    meta = {"namespace": "home", "name": "s"}
    source = {"type": SOURCE_TYPE, "metadata": meta, "data": {k: b64(v) for k, v in {
        "source": "z2m", "kind": "zigbee2mqtt", "node": "zigbee2mqtt", "password": "pw"}.items()}}
    assert secret_of(source) == Source("home", "z2m", "zigbee2mqtt", "zigbee2mqtt", "zigbee2mqtt", "pw")
    wildcard = {**source, "data": {**source["data"], "node": b64("zigbee2mqtt/#")}}
    assert secret_of(wildcard) is None
    bridge = {"type": BRIDGE_TYPE, "metadata": meta, "data": {"password": b64("pw")}}
    assert secret_of(bridge) == BridgeCredential("home", "corral-bridge", "pw")
    assert secret_of({"type": "Opaque", "metadata": meta, "data": {"password": b64("pw")}}) is None


def test_risk_overrides_and_source_names_as_accept_discovered_reads_them() -> None:
    assert parse_risks(["light=high", "brightness=low"]) == {"light": "high", "brightness": "low"}
    for wrong in ("light", "light=severe", "=high"):
        with pytest.raises(BridgeError, match="ACTUATOR=LEVEL"):
            parse_risks([wrong])
    assert as_label("Living_Room/Node") == "living-room-node" and as_label("zigbee2mqtt") == "zigbee2mqtt"

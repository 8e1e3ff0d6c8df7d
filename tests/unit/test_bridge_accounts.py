"""The broker accounts of bridged sources and the bridge (devices.bridge_accounts), and how they join the plan."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from corral.client.bridge import BridgeError, as_label, parse_risks
from corral.devcluster import files
from corral.devices.accounts import BRIDGE_PURPOSE, Account, account_plan, marker, plan_accounts
from corral.devices.bridge_accounts import (
    BRIDGE_TYPE,
    SOURCE_TYPE,
    BridgeCredential,
    Bridged,
    Source,
    plan_bridge_accounts,
    secret_of,
)
from corral.devices.bridge_checks import (
    ADMIN_USERNAME,
    CONTROLLER_USERNAME,
    Reserved,
    bridge_username_problem,
    source_clash,
    source_problem,
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
    assert len(plan.refused) == 3 and any("not under its source's topic root" in r.why for r in plan.refused)


def test_an_overlapping_newer_source_gets_no_account() -> None:
    newer = Source("other", "z2m-too", "zigbee2mqtt", "zigbee2mqtt/sub", "zigbee2mqtt/sub", "pw", created="2026-02-01")
    plan = plan_bridge_accounts(TOPICS, [Z2M, newer], [], [])
    assert "source.other.z2m-too" not in plan.accounts and "overlaps" in plan.refused[0].why


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
    assert secret_of(source) == Source("home", "z2m", "zigbee2mqtt", "zigbee2mqtt", "zigbee2mqtt", "pw", secret="s")
    wildcard = {**source, "data": {**source["data"], "node": b64("zigbee2mqtt/#")}}
    assert secret_of(wildcard) is None
    bridge = {"type": BRIDGE_TYPE, "metadata": meta, "data": {"password": b64("pw")}}
    assert secret_of(bridge) == BridgeCredential("home", "corral-bridge", "pw", secret="s")
    assert secret_of({"type": "Opaque", "metadata": meta, "data": {"password": b64("pw")}}) is None


def test_risk_overrides_and_source_names_as_accept_discovered_reads_them() -> None:
    assert parse_risks(["light=high", "brightness=low"]) == {"light": "high", "brightness": "low"}
    for wrong in ("light", "light=severe", "=high"):
        with pytest.raises(BridgeError, match="ACTUATOR=LEVEL"):
            parse_risks([wrong])
    assert as_label("Living_Room/Node") == "living-room-node" and as_label("zigbee2mqtt") == "zigbee2mqtt"


# ---- issue 41, finding 3: a Secret names no broker client Corral does not manage, no overlapping topic root ------

def test_the_account_keeper_never_changes_or_deletes_a_client_it_did_not_make() -> None:
    """The attack: a bridge credential (or an enrollment) naming the controller's account yielded `modifyClient
    corral-controller-0` with the attacker's password. A client without Corral's marker is left alone now."""
    controller = {"username": "corral-controller-0", "textName": "Corral controller",
                  "roles": [{"rolename": "corral-controller"}]}
    for account in (Account("corral-controller-0", "attacker", rules=(), purpose=BRIDGE_PURPOSE),
                    Account("corral-controller-0", "attacker")):
        plan = account_plan(TOPICS, {"corral-controller-0": account}, [controller],
                            [{"rolename": "corral-controller", "acls": []}])
        assert plan.commands == [] and [u for u, _ in plan.refused] == ["corral-controller-0"]
        assert "Corral did not make" in plan.refused[0][1]
    # Not wanted any more (the Secret deleted): still left alone, as is another prefix's client.
    other = {"username": "lamp", "textdescription": marker(Topics("other"), "pw"), "roles": []}
    assert account_plan(TOPICS, {}, [controller, other], []).commands == []
    # Wanted here, the other prefix's client is Corral's own and is taken over (device ids are unique per broker).
    taken = account_plan(TOPICS, {"lamp": Account("lamp", "pw")}, [other], []).commands
    assert [c["command"] for c in taken] == ["createRole", "modifyClient", "modifyClient"]
    assert taken[1]["textdescription"] == marker(TOPICS, "pw")


def test_a_client_corral_made_for_another_purpose_is_made_anew_and_one_of_its_own_is_changed() -> None:
    bridge = Account("corral-bridge", "new", rules=(), purpose=BRIDGE_PURPOSE)
    made_for_bridge = {"username": "corral-bridge", "textdescription": marker(TOPICS, "old", BRIDGE_PURPOSE),
                       "roles": [{"rolename": "corral-device-corral-bridge"}]}
    changed = account_plan(TOPICS, {"corral-bridge": bridge}, [made_for_bridge],
                           [{"rolename": "corral-device-corral-bridge", "acls": []}]).commands
    assert [c["command"] for c in changed] == ["modifyClient"]
    assert changed[0]["textdescription"] == marker(TOPICS, "new", BRIDGE_PURPOSE) != marker(TOPICS, "new")
    made_for_device = {**made_for_bridge, "textdescription": marker(TOPICS, "old")}
    anew = account_plan(TOPICS, {"corral-bridge": bridge}, [made_for_device],
                        [{"rolename": "corral-device-corral-bridge", "acls": []}]).commands
    assert [c["command"] for c in anew] == ["deleteClient", "createClient"]


def test_a_bridge_may_not_name_the_controllers_the_admins_a_devices_or_an_older_bridges_account() -> None:
    reserved = Reserved.around("rel-corral-controller-1", frozenset({"lamp"}))
    names = ["corral-controller-0", "rel-corral-controller-0", "rel-corral-controller", "corral-admin", "lamp",
             "bridge.lamp", "source.home.z2m", "corral-bridge"]
    bridges = [BridgeCredential("home", name, "pw", created=f"2026-01-0{i + 1}", secret=f"s{i}")
               for i, name in enumerate(names)]
    younger = BridgeCredential("away", "corral-bridge", "pw", created="2026-02-01", secret="late")
    plan = plan_bridge_accounts(TOPICS, [], [*bridges, younger], [], reserved)
    assert set(plan.accounts) == {"corral-bridge"} and plan.secrets["corral-bridge"] == ("home", "s7")
    refused = {r.secret: r.why for r in plan.refused}
    assert set(refused) == {("home", f"s{i}") for i in range(7)} | {("away", "late")}
    assert all("the controller's broker account" in refused[("home", f"s{i}")] for i in (0, 1, 2, 3))
    assert "a device enrolled with that id" in refused[("home", "s4")]
    assert "no '.'" in refused[("home", "s5")] and "taken by an older bridge" in refused[("away", "late")]
    assert bridge_username_problem("corral-bridge", Reserved()) is None


@pytest.mark.parametrize(("kind", "node", "root", "prefix", "why"), [
    ("ha", "porch", "iot", "homeassistant", "overlaps Corral's own device topics"),
    ("ha", "porch", "iot/porch", "homeassistant", "overlaps Corral's own device topics"),
    ("zigbee2mqtt", "iot", "iot", "homeassistant", "overlaps Corral's own device topics"),
    ("ha", "porch", "porch", "iot", "its discovery prefix 'iot' overlaps Corral's"),
    ("ha", "porch", "homeassistant", "homeassistant", "overlaps the discovery prefix"),
    ("ha", "porch", "homeassistant/light", "homeassistant", "overlaps the discovery prefix"),
    ("zigbee2mqtt", "homeassistant", "homeassistant", "homeassistant", "overlaps the discovery prefix"),
    ("ha", "porch", "$SYS", "homeassistant", "starts with '$'"),
    ("ha", "porch", "porch/#", "homeassistant", "wildcard"),
    ("ha", "porch", "porch/", "homeassistant", "empty level"),
    ("ha", "victim/lock", "porch", "homeassistant", "not one discovery topic level"),
    ("zigbee2mqtt", "z2m", "other", "homeassistant", "its base topic"),
])
def test_a_sources_topic_root_may_not_overlap_corrals_topics_or_a_discovery_prefix(
        kind: str, node: str, root: str, prefix: str, why: str) -> None:
    source = Source("home", "s", kind, node, root, "pw", prefix, secret="corral-bridge-source-s")
    assert why in (source_problem(source, "iot") or "")
    plan = plan_bridge_accounts(TOPICS, [source], [], [])
    assert not plan.accounts and plan.refused[0].secret == ("home", "corral-bridge-source-s")


def test_the_device_prefix_is_the_configured_one_and_a_root_beside_it_is_fine() -> None:
    assert "overlaps Corral's own" in (source_problem(Source("h", "s", "ha", "n", "home/n", "pw"), "home") or "")
    for root in ("porch", "iotx", "iot-porch", "home"):
        assert source_problem(Source("h", "s", "ha", "n", root, "pw"), "iot") is None, root
    assert plan_bridge_accounts(TOPICS, [Source("h", "s", "ha", "n", "iotx", "pw")], [], []).accounts


def test_sources_may_not_share_a_node_a_root_or_each_others_discovery_prefix() -> None:
    older = Source("home", "porch", "ha", "porch", "porch", "pw", created="2026-01-01")
    for newer in (Source("away", "p2", "ha", "Porch", "other", "pw", created="2026-02-01"),  # the same DNS label
                  Source("away", "p3", "ha", "n3", "porch/sub", "pw", created="2026-02-01"),
                  Source("away", "p4", "ha", "n4", "n4", "pw", "porch", created="2026-02-01"),
                  Source("away", "p5", "zigbee2mqtt", "disco", "disco", "pw", created="2026-02-01")):
        first = Source("home", "disco", "ha", "d", "d", "pw", "disco", created="2026-01-01") \
            if newer.name == "p5" else older
        assert source_clash(newer, first) is not None, newer
        assert newer.username not in plan_bridge_accounts(TOPICS, [first, newer], [], []).accounts
    assert source_clash(Source("away", "p6", "ha", "n6", "n6", "pw"), older) is None


def test_the_reserved_names_are_the_local_planes_and_the_charts() -> None:
    assert (ADMIN_USERNAME, CONTROLLER_USERNAME) == (files.BROKER_ADMIN, files.BROKER_CONTROLLER)
    assert all(Reserved().why(name) for name in files.LOCAL_CONTROLLER_ACCOUNTS)

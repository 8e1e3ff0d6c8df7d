"""Bridged devices' trust and broker accounts, on the real API server and the real Mosquitto (dynamic security).

A person accepts candidates the bridge wrote (`corral devices accept-discovered`); the controller, which requires
signed contracts here, binds a bridged Device's unsigned contract only with the hash the person accepted, and keeps
the broker accounts of the source and the bridge so that only the source can publish an accepted device's state,
and nothing of a device nobody accepted. The bridge itself is played by the test with the bridge's own account.

Issue 41, finding 3: bridge and source Secrets are read only from the namespaces the controller is told
(`--bridge-namespace`, here the site's); a Secret elsewhere, or one naming the controller's broker account, or a
source whose topic root is Corral's own device topics, makes nothing, and a Warning Event on it says why.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.api.capability import CapabilitySpec, capability_name
from corral.api.codes import GROUP, VERSION
from corral.api.discovered import contract_hash
from corral.cli.main import cli
from corral.client import bridge as bridging
from corral.client.enroll import enroll
from corral.contract.model import Contract
from corral.devcluster.files import LOCAL_CONTROLLER_REPLICAS
from corral.devcluster.plane import Plane
from corral.devcluster.processes import free_port
from corral.devices.bridge_accounts import BRIDGE_LABEL, BRIDGE_TYPE, SOURCE_TYPE
from tests.controller_harness import ControllerProcess, device, events
from tests.harness import (
    api_client,
    apply_yaml,
    fresh_namespace,
    grant,
    scrape,
    service_account_token,
    wait_for,
    wait_until_allowed,
)
from tests.mqtt5_harness import Account, client, granted, logs_in

pytestmark = pytest.mark.integration

NOT_AUTHORIZED = 0x87


def published(port: int, account: Account, topic: str, payload: str, retain: bool = False) -> int:
    """The PUBACK's reason code for one publish on a connection of its own. Fresh each time: a change of an
    account's role (a grant made or taken back) throws its connected clients off the broker."""
    with client(port, account) as c:
        connack = c.connect()
        return c.publish(topic, payload, retain=retain).value if granted(connack) else connack.value


def bulb_contract(device_id: str, maximum: float = 254) -> Contract:
    return Contract.model_validate({
        "device_id": device_id, "name": "Hue white", "model": "9290011370", "fw": "1.0.0",
        "actuators": [{"id": "light", "name": "Light", "type": "bool", "action": "set_state", "risk": "low",
                       "level": "write"},
                      {"id": "brightness", "name": "Brightness", "type": "number", "action": "set_value",
                       "range": {"min": 0, "max": maximum}, "risk": "low", "level": "write"}]})


@dataclass
class Site:
    plane: Plane
    admin: kubernetes.client.ApiClient
    namespace: str
    prefix: str
    base: str  # the zigbee2mqtt base topic
    source: Account
    bridge: Account
    other_source: Account
    elsewhere: str  # a watched namespace where bridge Secrets are not read
    controller: ControllerProcess
    username: str  # the controller's broker account
    metrics_port: int

    def discovered(self, name: str, contract: Contract) -> None:
        """What the bridge writes (server-side apply as corral-bridge)."""
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DiscoveredDevice", "metadata": {"name": name},
                "spec": {"source": self.base, "sourceKind": "zigbee2mqtt", "deviceId": contract.device_id,
                         "contract": CapabilitySpec.from_contract(contract).model_dump(mode="json", by_alias=True,
                                                                                      exclude_none=True),
                         "contractHash": contract_hash(contract),
                         "leftOut": [{"what": "light.effect", "reason": "an effect is not a target state"}],
                         "topics": {"command": [f"{self.base}/{name}/set"], "state": [f"{self.base}/{name}"],
                                    "availability": [f"{self.base}/{name}/availability"]},
                         "discoveredAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}}
        kubernetes.client.CustomObjectsApi(self.admin).patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "discovereddevices", name, body, field_manager="corral-bridge",
            force=True, _content_type="application/apply-patch+yaml")

    def accept(self, name: str, *more: str) -> Any:
        return CliRunner().invoke(cli, ["devices", "accept-discovered", name, "-n", self.namespace, "--yes",
                                        "--kubeconfig", str(self.plane.kubeconfig), *more])

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        status = device(self.admin, self.namespace, name).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})

    def settled(self, name: str, kind: str, status: str, what: str) -> dict[str, Any]:
        """The Device's condition once it has this status."""
        wait_for(lambda: self.condition(name, kind).get("status") == status, what)
        return self.condition(name, kind)


@pytest.fixture(scope="module")
def site(plane: Plane, corral_api: kubernetes.client.ApiClient,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    directory: Path = tmp_path_factory.mktemp("bridge")
    tag = uuid.uuid4().hex[:6]
    prefix, base = f"bridged-{tag}", f"z2m-{tag}"
    with fresh_namespace(corral_api, "bridge-accounts") as namespace, \
            fresh_namespace(corral_api, "bridge-elsewhere") as elsewhere:
        # Signatures required: a native device's contract must be signed; a bridged one stands on its acceptance.
        public = Ed25519PrivateKey.generate().public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        kubernetes.client.CoreV1Api(corral_api).create_namespaced_secret(namespace, {
            "metadata": {"name": "signing-keys"}, "data": {"vendor": base64.b64encode(public).decode()}})
        source = Account(*bridging.add_source(corral_api, namespace, "zigbee", "zigbee2mqtt", base))
        other = Account(*bridging.add_source(corral_api, namespace, "porch", "ha", f"porch-{tag}"))
        bridge = Account(*bridging.add_account(corral_api, namespace, f"bridge-{tag}"))
        # Its own broker account (a replica's, as the chart's `<release>-controller-N`); it watches a second namespace
        # but reads bridge Secrets only from the site's.
        username, metrics_port = LOCAL_CONTROLLER_REPLICAS[0], free_port()
        controller = ControllerProcess(plane, namespace, prefix, directory / "controller.log", "--require-signatures",
                                       "--signing-keys", f"{namespace}/signing-keys", "--watch-namespace", elsewhere,
                                       "--bridge-namespace", namespace, "--metrics-port", str(metrics_port),
                                       username=username)
        try:
            controller.start()
            site = Site(plane, corral_api, namespace, prefix, base, source, bridge, other, elsewhere, controller,
                        username, metrics_port)
            wait_for(lambda: all(logs_in(plane.mqtt_port, a) for a in (source, bridge, other)),
                     f"the sources' and the bridge's broker accounts (log: {directory})", timeout_s=20)
            yield site
        finally:
            controller.stop()


def test_accepting_a_candidate_binds_its_unsigned_contract_only_with_the_accepted_hash(site: Site) -> None:
    bulb, plug = bulb_contract("bulb"), bulb_contract("plug")
    site.discovered("bulb", bulb)
    site.discovered("plug", plug)
    shown = site.accept("bulb", "--as", "hall-lamp")
    assert shown.exit_code == 0, shown.output
    assert "actuator brightness: set_value 0..254, risk low" in shown.output and "left out: light.effect" in shown.output
    made = device(site.admin, site.namespace, "hall-lamp")["spec"]
    assert made["deviceId"] == "bulb" and made["bridge"]["acceptedContractHash"] == contract_hash(bulb)
    assert made["bridge"]["source"] == "zigbee" and made["bridge"]["acceptedBy"]
    candidate = kubernetes.client.CustomObjectsApi(site.admin).get_namespaced_custom_object(
        GROUP, VERSION, site.namespace, "discovereddevices", "bulb")["status"]
    assert candidate["accepted"] is True and candidate["device"] == "hall-lamp"
    again = site.accept("bulb")
    assert again.exit_code != 0 and "was accepted already" in again.output
    # The plug is accepted with a person's risk: the accepted hash is of the contract with it.
    assert site.accept("plug", "--risk", "light=high").exit_code == 0
    assert device(site.admin, site.namespace, "plug")["spec"]["bridge"]["risk"] == {"light": "high"}

    # The bridge announces, unsigned, as firmware would: the bulb's accepted contract, and a wider plug contract.
    port, wider = site.plane.mqtt_port, bulb_contract("plug", maximum=1000)
    wait_for(lambda: published(port, site.bridge, f"{site.prefix}/bulb/info", bulb.model_dump_json(exclude_none=True),
                               retain=True) < 0x80, "the bridge's grant on the bulb's info topic")
    wait_for(lambda: published(port, site.bridge, f"{site.prefix}/plug/info", wider.model_dump_json(exclude_none=True),
                               retain=True) < 0x80, "the bridge's grant on the plug's info topic")
    bound = site.settled("hall-lamp", "ContractAccepted", "True", "the bulb's unsigned contract bound with its hash")
    assert capability_name(bulb) in bound["message"]
    bridged = site.condition("hall-lamp", "Bridged")
    assert (bridged["status"], bridged["reason"]) == ("True", "Accepted")
    assert bridged["message"].startswith("bridged from zigbee; a person's acceptance stands in for the firmware")
    held = site.settled("plug", "ContractAccepted", "False", "the plug's contract held: not the one a person accepted")
    assert held["reason"] == "BridgedContractNotAccepted" and "not the one a person accepted" in held["message"]
    assert not (device(site.admin, site.namespace, "plug").get("status") or {}).get("acceptedCapability")


def test_a_native_device_still_needs_a_signature_and_a_changed_candidate_is_not_accepted(site: Site) -> None:
    password = enroll(site.admin, site.namespace, "native-lamp", "light").password
    native = bulb_contract("native-lamp")
    wait_for(lambda: published(site.plane.mqtt_port, Account("native-lamp", password), f"{site.prefix}/native-lamp/info",
                               native.model_dump_json(exclude_none=True), retain=True) < 0x80,
             "the native device's account, and its unsigned contract published")
    refused = site.settled("native-lamp", "ContractValid", "False", "the native device's unsigned contract refused")
    assert "signature" in refused["message"]
    # Only someone who may approve the Device may make it bridged (admission policy corral-device-bridge): an
    # operator who may create and patch Devices cannot grant broker topics or stand in for a signature.
    operator = grant(site.plane, site.admin, site.namespace, "operator", "[get, list, create, patch]", "[get]", "get")
    sneaky = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Device", "metadata": {"name": "sneaky"},
              "spec": {"deviceId": "sneaky", "bridge": {"source": "zigbee", "discovered": "sneaky",
                                                        "acceptedContractHash": contract_hash(native),
                                                        "topics": {"state": [f"{site.base}/sneaky"]}}}}

    def refused() -> bool:
        try:
            kubernetes.client.CustomObjectsApi(operator).create_namespaced_custom_object(
                GROUP, VERSION, site.namespace, "devices", sneaky, dry_run="All")
        except kubernetes.client.ApiException as err:
            return err.status == 403 and "corral-device-bridge" in err.body
        return False

    wait_for(refused, "a bridged Device refused to someone without the approve verb")
    # A candidate that changes between being shown and being accepted is not accepted.
    site.discovered("fan", bulb_contract("fan"))
    shown = bridging.candidate(site.admin, site.namespace, "fan")
    site.discovered("fan", bulb_contract("fan", maximum=100))
    with pytest.raises(bridging.BridgeError, match="changed since it was shown"):
        bridging.accept_discovered(site.admin, site.namespace, shown)


def test_only_the_source_may_publish_an_accepted_devices_state_and_nothing_of_an_unaccepted_one(site: Site) -> None:
    site.discovered("lamp", bulb_contract("lamp"))
    assert site.accept("lamp").exit_code == 0
    state, unaccepted, port = f"{site.base}/lamp", f"{site.base}/stranger", site.plane.mqtt_port
    wait_for(lambda: published(port, site.source, state, '{"state": "OFF"}') < 0x80,
             "the source's grant on the lamp's state (the controller syncs it within a second of the acceptance)")
    with client(port, site.bridge) as bridge, client(port, site.source) as source, \
            client(port, site.other_source) as other:
        assert all(granted(c.connect()) for c in (bridge, source, other))
        assert granted(bridge.subscribe(state))
        # Another account (a source of its own, admitted to the broker) cannot publish the lamp's state, nor can
        # the bridge itself: the bridge's subscriber never hears a forged state.
        assert other.publish(state, '{"state": "ON"}').value == NOT_AUTHORIZED
        assert bridge.publish(state, '{"state": "ON"}').value == NOT_AUTHORIZED
        assert granted(source.publish(state, '{"state": "OFF"}'))
        wait_for(lambda: any(m.payload == b'{"state": "OFF"}' for m in bridge.received), "the source's state heard")
        assert all(m.payload != b'{"state": "ON"}' for m in bridge.received)
        # A device nobody accepted: its source may not publish its state.
        assert source.publish(unaccepted, '{"state": "ON"}').value == NOT_AUTHORIZED
    # Deleting the Device takes the grant back.
    kubernetes.client.CustomObjectsApi(site.admin).delete_namespaced_custom_object(
        GROUP, VERSION, site.namespace, "devices", "lamp")
    wait_for(lambda: published(port, site.source, state, '{"state": "OFF"}') == NOT_AUTHORIZED,
             "the lamp's grant taken back with its Device")


# ---- issue 41, finding 3: a Secret does not take the controller's broker account ------------------------------

SECRET_WRITER = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: secret-writer}
rules:
- {apiGroups: [""], resources: [secrets], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: secret-writer}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: secret-writer}
subjects: [{kind: ServiceAccount, name: secret-writer, namespace: NAMESPACE}]
"""


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def bridge_secret(name: str, username: str, password: str) -> dict[str, Any]:
    """A bridge credential as `corral bridge add-account` writes it, naming any username."""
    return {"metadata": {"name": name, "labels": {BRIDGE_LABEL: "account"}}, "type": BRIDGE_TYPE,
            "data": {"username": b64(username), "password": b64(password)}}


def source_secret(name: str, node: str, root: str, password: str) -> dict[str, Any]:
    """A source Secret written by hand (`corral bridge add-source` refuses these roots itself)."""
    data = {"source": name, "kind": "ha", "node": node, "root": root, "password": password}
    return {"metadata": {"name": f"corral-bridge-source-{name}", "labels": {BRIDGE_LABEL: "source"}},
            "type": SOURCE_TYPE, "data": {k: b64(v) for k, v in data.items()}}


def refusal(site: Site, namespace: str, secret: str) -> str:
    """The note of the controller's Warning Event on this Secret ("" until there is one)."""
    return next((e.note for e in events(site.admin, namespace, secret)
                 if e.type == "Warning" and e.reason == "BridgeSecretRefused"), "")


def controller_connects(site: Site) -> int:
    """How often the broker let the controller's account connect (its log: `New client connected ... as NAME`)."""
    log = site.plane.broker_log.read_text(errors="replace") if site.plane.broker_log.exists() else ""
    return sum(1 for line in log.splitlines() if "New client connected" in line and f" as {site.username} " in line)


def test_a_secret_in_another_namespace_cannot_take_the_controllers_broker_account(site: Site) -> None:
    """The attack: a ServiceAccount of another namespace, allowed only to create Secrets there, names the
    controller's account in a bridge credential. Before: `modifyClient` with the attacker's password threw the
    controller off the broker, its heartbeat stopped and every device went to its failsafe."""
    core, port, tag = kubernetes.client.CoreV1Api(site.admin), site.plane.mqtt_port, uuid.uuid4().hex[:6]
    apply_yaml(site.admin, SECRET_WRITER.replace("NAMESPACE", site.elsewhere), site.elsewhere)
    writer = api_client(site.plane, token=service_account_token(site.admin, site.elsewhere, "secret-writer"))
    wait_until_allowed(writer, "create", site.elsewhere, "secrets", group="")
    lamp = enroll(site.admin, site.namespace, f"hb-{tag}", "light").password
    wait_for(lambda: logs_in(port, Account(f"hb-{tag}", lamp)), "an enrolled device's account")
    with client(port, Account(f"hb-{tag}", lamp)) as device_link:
        assert granted(device_link.connect())
        assert granted(device_link.subscribe(f"{site.prefix}/_corral/heartbeat"))
        wait_for(lambda: device_link.received, "the controller's heartbeat at the device")
        reconnects = scrape(site.metrics_port).get("corral_mqtt_reconnects_total", 0.0)
        connects = controller_connects(site)
        assert connects >= 1, "the broker's log names the controller's connection (else this proves nothing)"

        kubernetes.client.CoreV1Api(writer).create_namespaced_secret(
            site.elsewhere, bridge_secret("takeover", site.username, "attacker-pw"))
        note = wait_for(lambda: refusal(site, site.elsewhere, "takeover"), "a Warning Event on the Secret elsewhere")
        assert f"Secret {site.elsewhere}/takeover refused" in note and "reads no bridge or source credentials" in note
        # The same Secret where bridge Secrets are read: refused for the name it takes.
        core.create_namespaced_secret(site.namespace, bridge_secret("takeover", site.username, "attacker-pw"))
        note = wait_for(lambda: refusal(site, site.namespace, "takeover"), "a Warning Event on the Secret here")
        assert f"its username {site.username!r} is not the bridge's to take" in note, note
        assert "the controller's broker account" in note
        # A source whose topic root is Corral's device topics (the configured prefix, or iot) gets no account.
        for name, root in ((f"grab-{tag}", site.prefix), (f"iot-{tag}", "iot")):
            core.create_namespaced_secret(site.namespace, source_secret(name, name, root, "pw"))
            note = wait_for(lambda name=name: refusal(site, site.namespace, f"corral-bridge-source-{name}"),
                            f"a Warning Event on source {name}")
            assert f"its topic root {root!r} overlaps Corral's own device topics" in note, note
            assert not logs_in(port, Account(f"source.{site.namespace}.{name}", "pw"))
            with pytest.raises(bridging.BridgeError, match="overlaps Corral's own device topics"):
                bridging.add_source(site.admin, site.namespace, f"cli-{name}", "ha", name, root, topic_prefix=site.prefix)
        # Positive controls, made after the attack: a legitimate bridge and a source beside the prefix get accounts.
        late = Account(*bridging.add_account(site.admin, site.namespace, f"late-{tag}"))
        beside = Account(*bridging.add_source(site.admin, site.namespace, f"ok-{tag}", "ha", f"ok-{tag}",
                                              f"{site.prefix}-ok", topic_prefix=site.prefix))
        wait_for(lambda: logs_in(port, late) and logs_in(port, beside), "the late bridge's and source's accounts")
        # Deleting the Secrets (which deleted the controller's account before) changes nothing for it either; the
        # late bridge's account going with its Secret shows the controller synced after the deletions.
        for namespace in (site.elsewhere, site.namespace):
            core.delete_namespaced_secret("takeover", namespace)
        core.delete_namespaced_secret(f"corral-bridge-{late.username}", site.namespace)
        wait_for(lambda: not logs_in(port, late), "the late bridge's account gone with its Secret")
        heard = len(device_link.received)
        wait_for(lambda: len(device_link.received) >= heard + 2, "the controller's heartbeat still at the device")
        assert not device_link.dropped.is_set(), "the device was thrown off the broker"
    assert scrape(site.metrics_port).get("corral_mqtt_reconnects_total", 0.0) == reconnects
    assert controller_connects(site) == connects, "the controller's account connected again: it was thrown off"
    assert not logs_in(port, Account(site.username, "attacker-pw")), "the attacker's password is the controller's"

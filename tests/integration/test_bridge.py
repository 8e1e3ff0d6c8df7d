"""Bridged devices end to end: third-party devices discovered, invisible to agents until a person accepts them,
then controlled by an MCP agent through the bridge, on the real broker (with its ACLs) and the real API server.

The site (one per module): the controller (`corral run`), the bridge (`corral bridge run`, its own account, confirm
timeout 2 s), and five devices, each a source with its own broker account:

- a dimmable light, a lock, a water valve and a thermometer made with `ha-mqtt-discoverable` (tests/ha_harness.py):
  real Home Assistant discovery configurations, and responders that apply commands and publish their new state;
- a zigbee2mqtt bulb whose exposes come from zigbee-herdsman-converters' real definition (tests/z2m_harness.py).

Approvals are off for every risk here (`--approvals high=0`): the lock and the valve are high risk by the bridge's
mapping, and what this module proves is the bridge, not the approval flow (tested on its own elsewhere).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import paho.mqtt.client as mqtt
import pytest
import yaml
from click.testing import CliRunner

from corral.api.codes import GROUP, VERSION
from corral.audit.log import read_records
from corral.cli.main import cli
from corral.devcluster.plane import Plane
from corral.privatefile import write_private
from tests.broker_harness import observer
from tests.controller_harness import CORRAL, ControllerProcess, device
from tests.gateway_harness import capabilities_readable, grant_agent, kubeconfig_for, stdio_client
from tests.ha_harness import DocumentedDevice, HaLight, HaLock, HaSensor, HaValve, SourceAccount
from tests.harness import api_client, fresh_namespace, wait_for
from tests.mqtt5_harness import Account, client, granted, logs_in
from tests.z2m_devices import MODELS, bridge_devices
from tests.z2m_harness import Z2mResponder

pytestmark = pytest.mark.integration

NOT_AUTHORIZED = 0x87
CONFIRM_S = 2


@dataclass
class Watcher:
    """Every message on the devices' own command topics (an admin account): what the bridge published, when."""

    seen: list[tuple[str, bytes, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_message(self, _c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.seen.append((message.topic, bytes(message.payload), time.monotonic()))

    def on(self, topic: str, since: float = 0.0) -> list[bytes]:
        with self.lock:
            return [payload for t, payload, at in self.seen if t == topic and at >= since]


@dataclass
class Site:
    plane: Plane
    admin: kubernetes.client.ApiClient
    namespace: str
    prefix: str
    directory: Path
    controller: ControllerProcess
    bridge: subprocess.Popen[bytes]
    agent_config: Path
    sources: dict[str, SourceAccount]  # label (lamp, lock, valve, thermo) -> its source account
    labels: dict[str, str]  # source name -> label (the four, and the zigbee2mqtt instance: bulb)
    light: HaLight
    lock: HaLock
    valve: HaValve
    sensor: HaSensor
    fan: DocumentedDevice
    climate: DocumentedDevice
    z2m: Z2mResponder
    watcher: Watcher
    accepted: dict[str, str] = field(default_factory=dict)  # source -> Device name

    def discovered(self) -> dict[str, dict[str, Any]]:
        items = kubernetes.client.CustomObjectsApi(self.admin).list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "discovereddevices")["items"]
        return {self.labels[item["spec"]["source"]]: item for item in items if item["spec"]["source"] in self.labels}

    def accept_all(self) -> dict[str, str]:
        """Accept every discovered device as a person (`corral devices accept-discovered`), once."""
        if self.accepted:
            return self.accepted
        found = self.all_discovered()
        for label in self.labels.values():
            name = found[label]["metadata"]["name"]
            # The person raises the lamp's brightness to medium: the bridge announces the contract with it, and only
            # that contract (its hash) binds.
            risk = ["--risk", "lamp_brightness=medium"] if label == "lamp" else []
            corral(self.plane, "devices", "accept-discovered", name, "-n", self.namespace, "--yes", *risk)
            self.accepted[label] = name
        # The broker now lets each source publish its device's state: zigbee2mqtt says it again, as it would on
        # its next report (the first, before the grant, was dropped).
        self.z2m.resend("bulb")
        for source, name in self.accepted.items():
            wait_for(functools.partial(self.bound, name), f"{source}'s Device bound to the accepted contract",
                     timeout_s=20)
        self.climate.resend()
        for source, name in self.accepted.items():
            wait_for(functools.partial(self.ready, name), f"{source}'s Device online", timeout_s=10)
        return self.accepted

    def bound(self, name: str) -> bool:
        return self.condition(name, "ContractAccepted").get("status") == "True"

    def ready(self, name: str) -> bool:
        return (device(self.admin, self.namespace, name).get("status") or {}).get("online") is True

    def all_discovered(self) -> dict[str, dict[str, Any]]:
        def every() -> dict[str, dict[str, Any]]:
            found = self.discovered()
            return found if set(self.labels.values()) <= set(found) else {}
        return wait_for(every, f"a DiscoveredDevice for each source (bridge log: {self.directory / 'bridge.log'})")

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        status = device(self.admin, self.namespace, name).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})

    def actuator(self, label: str, action: str, named: str = "") -> str:
        contract = self.discovered()[label]["spec"]["contract"]
        return str(next(a["id"] for a in contract["actuators"] if a["action"] == action and named in a["id"]))

    def device_id(self, source: str) -> str:
        return str(self.discovered()[source]["spec"]["deviceId"])


def corral(plane: Plane, *args: str) -> str:
    """A `corral` command as a person runs it (the plane's admin kubeconfig), in this process; its stdout."""
    done = CliRunner().invoke(cli, list(args), env={"KUBECONFIG": str(plane.kubeconfig)})
    assert done.exit_code == 0, done.output
    return done.stdout


def credentials(printed: str) -> tuple[str, str]:
    """(username, password) as `corral bridge add-source|add-account` print them."""
    fields = dict(line.split(None, 1) for line in printed.splitlines() if line.strip())
    return fields["username"].strip(), fields["password"].strip()


def add_ha_source(plane: Plane, namespace: str, name: str) -> SourceAccount:
    """A Home Assistant discovery node as its own source: node id = its name, topics under `hmd-<name>`."""
    username, password = credentials(corral(plane, "bridge", "add-source", name, "--kind", "ha", "--node", name,
                                            "--topic-root", f"hmd-{name}", "-n", namespace))
    return SourceAccount(username, password, name, f"hmd-{name}")


@pytest.fixture(scope="module")
def site(plane: Plane, corral_api: kubernetes.client.ApiClient,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    directory = tmp_path_factory.mktemp("bridge")
    prefix = f"br-{uuid.uuid4().hex[:6]}"
    tag = uuid.uuid4().hex[:4]
    with fresh_namespace(corral_api, "bridge") as namespace, capabilities_readable(corral_api, namespace, "agent"):
        sources = {kind: add_ha_source(plane, namespace, f"{kind}-{tag}") for kind in ("lamp", "lock", "valve", "thermo", "fan", "clim")}
        z2m_base = f"z2m-{tag}"
        z2m_account = credentials(corral(plane, "bridge", "add-source", z2m_base, "--kind", "zigbee2mqtt",
                                         "--base-topic", z2m_base, "-n", namespace))
        bridge_user, bridge_password = credentials(corral(plane, "bridge", "add-account", "--username",
                                                          f"corral-bridge-{tag}", "-n", namespace))
        write_private(directory / "bridge.password", bridge_password)
        agent_token = grant_agent(plane, corral_api, namespace)
        agent_config = kubeconfig_for(plane, agent_token, directory / "agent.kubeconfig", namespace)
        controller = ControllerProcess(plane, namespace, prefix, directory / "controller.log", "--command-timeout",
                                       str(CONFIRM_S + 4), "--approvals", "medium=0", "--approvals", "high=0",
                                       "--approvals", "critical=0", "--bridge-namespace", namespace)
        controller.start()
        opened: list[Any] = []
        watcher_client: mqtt.Client | None = None
        bridge: subprocess.Popen[bytes] | None = None
        try:
            # The controller makes the accounts from the Secrets `corral bridge add-source|add-account` wrote.
            for username, password in [*((s.username, s.password) for s in sources.values()), z2m_account,
                                       (bridge_user, bridge_password)]:
                wait_for(functools.partial(logs_in, plane.mqtt_port, Account(username, password)),
                         f"the broker account {username}", timeout_s=20)
            with open(directory / "bridge.log", "wb") as log:
                bridge = subprocess.Popen(
                    [CORRAL, "bridge", "run", "--mqtt", f"mqtt://{bridge_user}@127.0.0.1:{plane.mqtt_port}",
                     "--mqtt-password-file", str(directory / "bridge.password"), "-n", namespace,
                     "--topic-prefix", prefix, "--confirm-timeout", str(CONFIRM_S), "--z2m-base-topic", z2m_base],
                    env={**os.environ, "KUBECONFIG": str(plane.kubeconfig)}, stdout=log, stderr=subprocess.STDOUT)
            light = HaLight(sources["lamp"], plane.mqtt_port)
            opened.append(light)
            lock = HaLock(sources["lock"], plane.mqtt_port)
            opened.append(lock)
            valve = HaValve(sources["valve"], plane.mqtt_port)
            opened.append(valve)
            sensor = HaSensor(sources["thermo"], plane.mqtt_port)
            opened.append(sensor)
            fan = DocumentedDevice(sources["fan"], plane.mqtt_port, "fan_presets")
            opened.append(fan)
            climate = DocumentedDevice(sources["clim"], plane.mqtt_port, "climate_abbreviated")
            opened.append(climate)
            z2m = Z2mResponder(plane, z2m_account, z2m_base, bridge_devices(bulb=MODELS["bulb"])).start()
            opened.append(z2m)
            watcher = Watcher()
            username, password = observer(plane, "bridge-watcher")
            watcher_client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=username, protocol=mqtt.MQTTv5)
            watcher_client.username_pw_set(username, password)
            watcher_client.on_message = watcher.on_message
            watcher_client.connect("127.0.0.1", plane.mqtt_port)
            watcher_client.loop_start()
            for topic in (light.command_topic, lock.command_topic, valve.command_topic):
                watcher_client.subscribe(topic, qos=1)
            labels = {**{source.node: label for label, source in sources.items()}, z2m_base: "bulb"}
            yield Site(plane, corral_api, namespace, prefix, directory, controller, bridge, agent_config, sources,
                       labels, light, lock, valve, sensor, fan, climate, z2m, watcher)
        finally:
            for thing in opened:
                thing.stop() if isinstance(thing, Z2mResponder) else thing.close()
            if watcher_client is not None:
                watcher_client.disconnect()
                watcher_client.loop_stop()
            if bridge is not None and bridge.poll() is None:
                bridge.terminate()
                bridge.wait(15)
            controller.stop()


def control(device: str, actuator: str, action: str, value: Any) -> dict[str, Any]:
    """An iot.control call for the Device named `device` (test namespaces are unique: its name says which)."""
    return {"device_id": device, "actuator": actuator, "action": action, "params": {"value": value},
            "reason": "bridge test"}


async def agent_call(site: Site, tool: str, arguments: dict[str, Any]) -> Any:
    async with stdio_client(site.agent_config) as agent:
        return await agent.call_tool(tool, arguments)


# ---- the tests, in order: discovered, accepted and controlled, refused, held, audited -------------------------

def test_discovered_devices_are_candidates_that_agents_cannot_see(site: Site) -> None:
    found = site.all_discovered()
    lamp = found["lamp"]["spec"]
    assert lamp["sourceKind"] == "ha"
    assert {a["action"] for a in lamp["contract"]["actuators"]} == {"set_state", "set_value"}
    assert lamp["topics"]["command"] == [site.light.command_topic]
    assert [s["unit"] for s in found["thermo"]["spec"]["contract"]["sensors"]] == ["°C"]
    assert {a["risk"] for a in found["lock"]["spec"]["contract"]["actuators"]} == {"high"}

    async def seen() -> str:
        """Everything the agent's gateway offers it: its tools and their descriptions."""
        async with stdio_client(site.agent_config) as agent:
            tools = (await agent.list_tools()).tools
            return json.dumps([tool.model_dump(mode="json") for tool in tools])

    offered = asyncio.run(seen())
    assert not any(item["metadata"]["name"] in offered or item["spec"]["deviceId"] in offered
                   for item in found.values()), offered
    agent = kubernetes.client.CustomObjectsApi(api_client(site.plane, token=_token(site)))
    with pytest.raises(kubernetes.client.ApiException) as refused:
        agent.list_namespaced_custom_object(GROUP, VERSION, site.namespace, "discovereddevices")
    assert refused.value.status == 403


def _token(site: Site) -> str:
    config = yaml.safe_load(site.agent_config.read_text())
    return str(config["users"][0]["user"]["token"])


def test_accepted_devices_are_controlled_by_an_agent_and_confirmed_by_their_own_state(site: Site) -> None:
    accepted = site.accept_all()
    assert site.condition(accepted["lamp"], "Bridged").get("status") == "True"
    # What a source offers and the bridge could not map is named in the Device's status, as the person accepted it.
    with_left_out = {label: found["spec"]["leftOut"] for label, found in site.discovered().items()
                     if found["spec"].get("leftOut") and label in accepted}
    assert with_left_out, "some discovered device leaves something out (else this proves nothing)"
    for label, parts in with_left_out.items():
        bridged = wait_for(lambda label=label: site.condition(accepted[label], "Bridged").get("message"),
                           f"{label}'s Bridged condition")
        assert "left out (not offered)" in bridged and parts[0]["what"] in bridged, bridged
    lamp = device(site.admin, site.namespace, accepted["lamp"])
    assert lamp["spec"]["bridge"]["risk"] == {"lamp_brightness": "medium"}
    assert lamp["status"]["acceptedCapability"] == lamp["status"]["capability"]
    brightness = site.actuator("lamp", "set_value")
    bolt = site.actuator("lock", "set_state")
    water = site.actuator("valve", "set_state")
    bulb = site.actuator("bulb", "set_value", "brightness")
    preset = site.actuator("fan", "set_mode", "preset")
    target = site.actuator("clim", "set_value")

    async def scenario() -> list[dict[str, Any]]:
        async with stdio_client(site.agent_config) as agent:
            devices = {d["device_id"] for d in
                       (await agent.call_tool("iot.list_devices", {})).structured_content["devices"]}
            assert {f"{site.namespace}/{name}" for name in accepted.values()} <= devices, devices
            answers = []
            for args in (control(accepted["lamp"], brightness, "set_value", 128),
                         control(accepted["lock"], bolt, "set_state", True),
                         control(accepted["valve"], water, "set_state", True),
                         control(accepted["bulb"], bulb, "set_value", 200),
                         control(accepted["fan"], preset, "set_mode", "eco"),
                         control(accepted["clim"], target, "set_value", 21.5)):
                answers.append((await agent.call_tool("iot.control", args)).structured_content)
            return answers

    answers = asyncio.run(scenario())
    assert [a["code"] for a in answers] == ["EXECUTED"] * 6, [(a["code"], a["message"]) for a in answers]
    assert site.light.responder.state == {"state": "ON", "brightness": 128}
    assert site.lock.responder.state == {"state": "LOCKED"}
    assert site.valve.responder.state == {"state": "open"}
    assert site.fan.responder.state == {site.fan.config["preset_mode_state_topic"]: "eco"}
    assert site.climate.responder.state["target_temp"] == 21.5
    # Each command went to its device once, as the device's own payload.
    assert [json.loads(p) for p in site.watcher.on(site.light.command_topic)] == [{"state": "ON", "brightness": 128}]
    assert site.watcher.on(site.lock.command_topic) == [b"LOCK"]
    assert site.watcher.on(site.valve.command_topic) == [b"OPEN"]
    # zigbee2mqtt echoed the command optimistically, then the bulb reported: the bridge waited for the report.
    assert site.z2m.state("bulb")["brightness"] == 200
    assert [json.loads(m.payload) for m in site.z2m.sets_for("bulb")] == [{"brightness": 200, "state": "ON"}]
    # The thermometer's readings arrive as telemetry: the controller keeps them for the Device.
    site.sensor.publish(21.5)
    wait_for(lambda: "21.5" in json.dumps((device(site.admin, site.namespace, accepted["thermo"]).get("status")
                                            or {}).get("sensors") or {}),
             "the thermometer's reading on its Device", timeout_s=10)


def test_a_value_outside_the_contract_is_refused_before_anything_is_published(site: Site) -> None:
    accepted = site.accept_all()
    brightness = site.actuator("lamp", "set_value")
    since = time.monotonic()
    answer = asyncio.run(agent_call(site, "iot.control", control(accepted["lamp"], brightness, "set_value", 999)))
    assert answer.is_error or answer.structured_content["code"] == "DENY_ARGUMENTS", answer
    # Past the controller (a command on the bridged device's cmd topic itself): the bridge refuses it too.
    device_id = site.device_id("lamp")
    with client(site.plane.mqtt_port, Account(*observer(site.plane, "bridge-cmd"))) as raw:
        assert granted(raw.connect())
        raw.subscribe(f"{site.prefix}/{device_id}/ack")
        command = {"id": "out-of-range-1", "cmd": "set_value", "params": {"actuator": brightness, "value": 999}}
        raw.publish(f"{site.prefix}/{device_id}/cmd", json.dumps(command))
        ack = json.loads(wait_for(lambda: next((bytes(m.payload) for m in raw.received
                                                if b"out-of-range-1" in m.payload), b""), "the bridge's ack"))
    assert ack["ok"] is False and "from 0 to 255" in ack["error"], ack
    assert site.watcher.on(site.light.command_topic, since) == []


def test_a_device_that_never_confirms_fails_once_and_another_account_cannot_confirm_it(site: Site) -> None:
    accepted = site.accept_all()
    water = site.actuator("valve", "set_state")
    site.valve.responder.mute = True
    since = time.monotonic()
    forged: list[int] = []

    def forge() -> None:
        # While the bridge waits: the lamp's source account writes "closed" on the valve's state topic.
        wait_for(lambda: site.watcher.on(site.valve.command_topic, since), "the valve's command on its topic")
        lamp = site.sources["lamp"]
        with client(site.plane.mqtt_port, Account(lamp.username, lamp.password)) as other:
            assert granted(other.connect())
            forged.append(other.publish(site.valve.state_topic, "closed").value)

    forger = threading.Thread(target=forge)
    forger.start()
    try:
        answer = asyncio.run(agent_call(site, "iot.control", control(accepted["valve"], water, "set_state", False)))
    finally:
        forger.join(10)
        site.valve.responder.mute = False
    out = answer.structured_content
    assert out["code"] == "FAILED", out
    assert (f"the device did not confirm {water}=false within {CONFIRM_S} s; the command was published once and "
            "not retried") in out["message"], out
    assert forged == [NOT_AUTHORIZED]
    # The bridge waited the whole timeout before it acked: a second publish would have been seen by now.
    assert site.watcher.on(site.valve.command_topic, since) == [b"CLOSE"]
    assert site.valve.responder.commands[-1] == "CLOSE" and site.valve.responder.state == {"state": "open"}
    # The target stays set, so the controller drives it again with a new command id: the bridge answers that at
    # once, and the device still got the command once.
    subject = f"{site.namespace}/{accepted['valve']}"

    def refused_again() -> list[str]:
        return [str(r.data.get("error")) for r in read_records(site.controller.audit_dir)
                if r.kind == "ack.received" and r.subject == subject and r.data.get("ok") is False
                and "not published again" in str(r.data.get("error"))]

    assert "did not confirm" in wait_for(refused_again, "the controller's next try answered by the bridge")[0]
    assert site.watcher.on(site.valve.command_topic, since) == [b"CLOSE"]
    assert site.valve.responder.commands.count("CLOSE") == 1


def test_a_wider_configuration_is_held_until_a_person_accepts_it(site: Site) -> None:
    accepted = site.accept_all()
    name = accepted["lamp"]
    before = site.discovered()["lamp"]["spec"]["contractHash"]
    site.light.announce(brightness_scale=1000)
    wait_for(lambda: site.discovered()["lamp"]["spec"]["contractHash"] != before, "the candidate updated")
    def holding() -> dict[str, Any]:
        condition = site.condition(name, "ContractAccepted")
        return condition if condition.get("status") == "False" else {}
    held = wait_for(holding, "the wider contract held")
    assert "1000" in held["message"], held
    device_spec = device(site.admin, site.namespace, name)["spec"]
    assert device_spec["bridge"]["acceptedContractHash"] != site.discovered()["lamp"]["spec"]["contractHash"]
    done = CliRunner().invoke(cli, ["devices", "accept-contract", name, "-n", site.namespace],
                              env={"KUBECONFIG": str(site.plane.kubeconfig)})
    assert done.exit_code == 0, done.output
    wait_for(lambda: site.condition(name, "ContractAccepted").get("status") == "True", "the wider contract accepted")


def test_a_value_the_device_already_has_is_published_once_and_ends_executed_without_an_echo(site: Site) -> None:
    accepted = site.accept_all()
    bolt = site.actuator("lock", "set_state")
    wait_for(lambda: (device(site.admin, site.namespace, accepted["lock"]).get("status") or {}).get(
        "reported", {}).get(bolt) is True, "the lock reported locked")
    since = time.monotonic()
    answer = asyncio.run(agent_call(site, "iot.control", control(accepted["lock"], bolt, "set_state", True)))
    out = answer.structured_content
    assert out["code"] == "EXECUTED", out
    # ha-mqtt-discoverable publishes no unchanged state: the bridge waited out its timeout and said so.
    assert site.watcher.on(site.lock.command_topic, since) == [b"LOCK"]
    notes = [r.data for r in read_records(site.controller.audit_dir) if r.kind == "ack.received"
             and r.subject == f"{site.namespace}/{accepted['lock']}"]
    assert notes[-1]["ok"] is True and notes[-1]["state"] == {bolt: True}


def candidate_of(site: Site, source: str, name: str) -> dict[str, Any]:
    """The DiscoveredDevice of `source`'s device named `name` ({} until the bridge wrote it)."""
    items = kubernetes.client.CustomObjectsApi(site.admin).list_namespaced_custom_object(
        GROUP, VERSION, site.namespace, "discovereddevices")["items"]
    return next((i for i in items if i["spec"]["source"] == source and i["spec"]["contract"]["name"] == name), {})


def test_a_source_cannot_offer_a_light_on_another_sources_lock_and_its_own_light_is_offered(site: Site) -> None:
    """Issue 41, finding 7. The attack: the lamp's source announces a "light" on a topic without a node id, whose
    payload claims the lock's source (its device identifiers) and whose command topic is the lock's, with
    `payload_on: UNLOCK`. Before, the candidate was the lock source's, under its root: a person accepting a
    low-risk light gave an agent's "on" the door."""
    accepted = site.accept_all()
    lamp, lock = site.sources["lamp"], site.sources["lock"]
    trap = {"name": "trap", "cmd_t": site.lock.command_topic, "stat_t": site.lock.entity.state_topic, "pl_on": "UNLOCK",
            "pl_off": "LOCK", "dev": {"ids": [lock.node], "name": "trap"}}
    own = {"name": "desk", "cmd_t": f"{lamp.root}/desk/set", "stat_t": f"{lamp.root}/desk/state",
           "dev": {"ids": ["desk-id"], "name": "desk"}}
    # On the lamp source's own connection (its client id is its username: another would take its session over).
    for topic, config in ((f"homeassistant/light/{lamp.node}/config", trap),
                          (f"homeassistant/light/{lamp.node}/desk/config", own)):
        site.light.entity.mqtt_client.publish(topic, json.dumps(config), qos=1, retain=True).wait_for_publish(5)
    # The candidate is the lamp source's (the topic's publisher), and the light on the lock's topic is left out.
    offered = wait_for(lambda: candidate_of(site, lamp.node, "trap"), f"the trap's candidate ({site.directory})")
    assert not offered["spec"]["contract"]["actuators"], offered["spec"]
    reason = " ".join(part["reason"] for part in offered["spec"]["leftOut"])
    assert f"is already accepted for Device {accepted['lock']}" in reason, reason
    assert not candidate_of(site, lock.node, "trap"), "a candidate claims the lock's source"
    assert "left out of the candidate" in (site.directory / "bridge.log").read_text()
    # Positive control: the lamp source's own light is offered, with its actuator, and accepted binds.
    desk = wait_for(lambda: candidate_of(site, lamp.node, "desk"), "the desk light's candidate")
    assert [a["action"] for a in desk["spec"]["contract"]["actuators"]] == ["set_state"]
    corral(site.plane, "devices", "accept-discovered", desk["metadata"]["name"], "-n", site.namespace, "--yes")
    wait_for(lambda: site.bound(desk["metadata"]["name"]), "the desk light bound to its accepted contract")


def test_a_state_with_a_400_digit_number_is_no_value_and_the_next_state_still_reads(site: Site) -> None:
    """Issue 41, finding 12: a 400-digit number escaped the template's error handling as OverflowError, one
    traceback per message in the bridge's log."""
    site.accept_all()
    state, device_id = site.climate.config["temp_stat_t"], site.device_id("clim")
    with client(site.plane.mqtt_port, Account(*observer(site.plane, "bridge-telemetry"))) as heard:
        assert granted(heard.connect())
        assert granted(heard.subscribe(f"{site.prefix}/{device_id}/telemetry"))
        for current in (int("9" * 400), -int("9" * 400), 23.25):
            body = json.dumps({**site.climate.state, "current_temp": current})
            site.climate.client.publish(state, body, qos=1).wait_for_publish(5)
        said = wait_for(lambda: [m.payload for m in heard.received if b"23.25" in m.payload],
                        "the climate's next reading in its telemetry")
    assert all(b"999999" not in m.payload and b"Infinity" not in m.payload for m in heard.received), said
    log = (site.directory / "bridge.log").read_text()
    assert "Traceback" not in log and "OverflowError" not in log, log[-2000:]


def test_availability_maps_to_online_and_the_bridges_death_makes_every_device_offline(site: Site) -> None:
    accepted = site.accept_all()

    def online(label: str) -> bool | None:
        return bool((device(site.admin, site.namespace, accepted[label]).get("status") or {}).get("online"))

    site.z2m.set_available("bulb", False)
    wait_for(lambda: online("bulb") is False, "the bulb offline (zigbee2mqtt's availability)")
    site.z2m.set_available("bulb", True)
    wait_for(lambda: online("bulb") is True, "the bulb online again")
    site.bridge.kill()  # SIGKILL: no goodbye; each device's presence connection leaves its Will
    site.bridge.wait(10)
    wait_for(lambda: not any(online(label) for label in accepted), "every bridged Device offline", timeout_s=15)


def test_every_bridged_action_has_its_audit_records(site: Site) -> None:
    accepted = site.accept_all()
    bridged = {accepted[source] for source in ("lamp", "lock", "valve")}
    records = list(read_records(site.controller.audit_dir))
    outcomes = {(r.data.get("device"), r.data.get("code")) for r in records if r.kind == "intent.decided"}
    assert {(name, "EXECUTED") for name in bridged} <= outcomes, outcomes
    assert (accepted["valve"], "FAILED") in outcomes, outcomes
    for kind in ("intent.executing", "command.sent", "ack.received"):
        about = {r.subject.split("/")[-1] for r in records if r.kind == kind} | {
            r.data.get("device") for r in records if r.kind == kind}
        assert bridged <= about, (kind, about)

"""`corral bridge run`: one asyncio loop that speaks Corral's device protocol for every accepted bridged device.

- **Discovery in** (Home Assistant `<prefix>/.../config`, zigbee2mqtt `<base>/bridge/devices`): read into the shared
  model (bridge/catalog.py), derived into a contract (mapping), written as a DiscoveredDevice (bridge/candidates.py;
  server-side apply, nothing written when nothing changed). Agents have no RBAC on that kind: a candidate is
  invisible to them.
- **Accepted devices** (Devices in the namespace with `spec.bridge`, listed and watched): the bridge announces the
  derived contract with the person's risk overrides, retained on `iot/<id>/info`, unsigned (the controller binds it
  only with the accepted hash, and holds a later widening like a native device's); `iot/<id>/status` from the
  device's availability on a presence connection whose Will is `offline` (bridge/link.py); readings from its state
  topics on `iot/<id>/telemetry`; and `iot/<id>/cmd` answered on `iot/<id>/ack` (bridge/commands.py, confirm.py).
- **Topics already accepted** (bridge/claims.py): a candidate's component whose command topic is another accepted
  Device's topic (or whose state topic is another's command topic), or that lies under Corral's device prefix, is left
  out of the candidate with the reason; an accepted Device's command on an older Device's topic is refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from corral.api.codes import GROUP, VERSION
from corral.bridge import claims
from corral.bridge.candidates import Candidates
from corral.bridge.catalog import Bridged, Catalog, derive, device_id_for
from corral.bridge.commands import Answer, Commands, Execute
from corral.bridge.confirm import UNKNOWN, Confirmation, Confirmed
from corral.bridge.link import Arrived, BridgeLink, Presence
from corral.bridge.model import DeviceKey, Discovered
from corral.contract.values import Value
from corral.devices.link import BrokerAddress, TlsFiles
from corral.kube.client import ApiError, AsyncApi, path_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BridgeSettings:
    namespace: str
    prefix: str = "iot"
    discovery_prefix: str = "homeassistant"
    z2m_base_topics: tuple[str, ...] = ("zigbee2mqtt",)
    confirm_timeout_s: float = 5.0
    relist_s: float = 30.0


@dataclass
class Accepted:
    """One accepted bridged Device, as the bridge speaks for it."""

    name: str  # the Device's name
    device_id: str
    discovered: str  # the DiscoveredDevice's name
    key: DeviceKey | None
    risk: dict[str, str]
    granted: frozenset[str] = frozenset()  # the device's own topics a person accepted (spec.bridge.topics)
    command_topics: frozenset[str] = frozenset()  # of those, its command topics
    created: str = ""  # the Device's creationTimestamp: the older of two Devices keeps a topic both name
    bridged: Bridged | None = None
    announced: str | None = None  # the info payload last published (retained)
    state: dict[str, Value] = field(default_factory=dict)
    commands: Commands = field(default_factory=Commands)
    waiting: dict[str, tuple[Confirmation, Execute]] = field(default_factory=dict)  # command id ->
    presence: Presence | None = None
    online: bool | None = None


class Bridge:
    def __init__(self, address: BrokerAddress, api: AsyncApi, settings: BridgeSettings,
                 tls: TlsFiles | None = None) -> None:
        self.address = address
        self.tls = tls or TlsFiles()
        self.api = api
        self.settings = settings
        self.catalog = Catalog(settings.discovery_prefix, settings.z2m_base_topics)
        self.candidates = Candidates(api, settings.namespace)
        self.link = BridgeLink(address, self._on_message, self._on_connected, self.tls)
        self.accepted: dict[str, Accepted] = {}  # device id ->
        self._by_topic: dict[str, str] = {}  # a bridged device's own state/availability topic -> device id
        self._tasks: list[asyncio.Task[None]] = []

    async def run(self, stop: asyncio.Event) -> None:
        self.link.subscribe([*self.catalog.subscriptions()])
        await self.link.start()
        self._tasks = [asyncio.create_task(self._follow_devices(), name="bridge-devices"),
                       asyncio.create_task(self.candidates.run(), name="bridge-candidates")]
        try:
            await stop.wait()
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await asyncio.gather(*(asyncio.to_thread(a.presence.close) for a in self.accepted.values()
                                   if a.presence is not None))
            await self.link.stop()

    # MQTT in ---------------------------------------------------------------------------------

    def _on_connected(self) -> None:
        log.info("bridge connected to %s:%s", self.address.host, self.address.port)
        for accepted in self.accepted.values():
            accepted.announced = None  # announce again: the broker may have lost retained messages
            self._announce(accepted)

    def _on_message(self, message: Arrived) -> None:
        prefix = self.settings.prefix + "/"
        if message.topic.startswith(prefix) and message.topic.endswith("/cmd"):
            accepted = self.accepted.get(message.topic[len(prefix):-len("/cmd")])
            if accepted is not None and not message.retained:
                self._command(accepted, message.payload)
            return
        device_id = self._by_topic.get(message.topic)
        if device_id is not None and device_id in self.accepted:
            self._device_message(self.accepted[device_id], message)
        changed = self.catalog.read(message.topic, message.payload)
        for key in changed:
            self._discovery_changed(key)

    def _discovery_changed(self, key: DeviceKey) -> None:
        discovered = self.catalog.device(key)
        if discovered is None:
            return
        device_id = device_id_for(key, discovered.device)
        offered = self._screened(discovered, [c for c in self._claims() if c.device_id != device_id])
        self.candidates.offer(device_id, offered, derive(offered, device_id, {}))
        accepted = self.accepted.get(device_id)
        if accepted is not None:
            self._bind(accepted)

    # Accepted devices ----------------------------------------------------------------------

    async def _follow_devices(self) -> None:
        path = path_of(GROUP, VERSION, "devices", self.settings.namespace)
        while True:
            try:
                listed = await self.api.request("GET", path)
                items = {str(item["metadata"]["name"]): item for item in listed.get("items") or []}
                self._devices(list(items.values()))
                version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
                async for event in self.api.watch(path, {"resourceVersion": version,
                                                         "timeoutSeconds": str(int(self.settings.relist_s))},
                                                  timeout_s=self.settings.relist_s):
                    kind, item = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        break  # e.g. the version is too old: list again
                    name = str((item.get("metadata") or {}).get("name") or "")
                    if kind in ("ADDED", "MODIFIED"):
                        items[name] = item
                    elif kind == "DELETED":
                        items.pop(name, None)
                    else:
                        continue
                    self._devices(list(items.values()))
            except asyncio.CancelledError:
                raise
            except (TimeoutError, ApiError, OSError, ValueError) as err:
                log.warning("listing Devices in %s failed (%s); trying again", self.settings.namespace, err)
                await asyncio.sleep(1.0)
            except Exception:
                log.exception("following Devices failed; trying again")
                await asyncio.sleep(1.0)

    def _devices(self, items: list[dict[str, Any]]) -> None:
        seen: set[str] = set()
        for item in items:
            spec = item.get("spec") or {}
            bridge = spec.get("bridge")
            device_id = spec.get("deviceId")
            if not isinstance(bridge, dict) or not isinstance(device_id, str):
                continue
            seen.add(device_id)
            risk = {str(k): str(v) for k, v in (bridge.get("risk") or {}).items()}
            topics = bridge.get("topics") or {}
            granted = frozenset(str(t) for kind in ("command", "state", "availability") for t in topics.get(kind) or [])
            commands = frozenset(str(t) for t in topics.get("command") or [])
            accepted = self.accepted.get(device_id)
            if accepted is None:
                meta = item.get("metadata") or {}
                accepted = Accepted(name=str(meta.get("name")), device_id=device_id,
                                    discovered=str(bridge.get("discovered") or ""), key=None, risk=risk,
                                    granted=granted, command_topics=commands, created=str(meta.get("creationTimestamp") or ""))
                self.accepted[device_id] = accepted
                self.link.subscribe([f"{self.settings.prefix}/{device_id}/cmd"])
                accepted.presence = Presence(self.address, self.tls, f"{self.link.client_id}.{device_id}",
                                             f"{self.settings.prefix}/{device_id}/status")
                self._bind(accepted)
            elif accepted.risk != risk or accepted.granted != granted:
                accepted.risk, accepted.granted, accepted.command_topics = risk, granted, commands
                self._bind(accepted)
        for device_id in set(self.accepted) - seen:
            self._forget(self.accepted.pop(device_id))

    def _bind(self, accepted: Accepted) -> None:
        """Derive the accepted device's contract from what discovery says now (with the person's risks), follow
        its topics, announce it."""
        found = self.catalog.find(accepted.device_id)
        if found is None:
            return  # not discovered (yet): nothing to announce; commands are answered with no contract
        accepted.key = found.key
        accepted.bridged = derive(self._screened(found, self._claims(older_than=accepted)), accepted.device_id,
                                  accepted.risk)
        # Only what a person accepted: the broker grants exactly those (a topic discovery added since is not).
        topics = [t for t in (*accepted.bridged.topics.state, *accepted.bridged.topics.availability)
                  if t in accepted.granted]
        for topic in topics:
            self._by_topic[topic] = accepted.device_id
        self.link.subscribe(topics)
        if not accepted.bridged.topics.availability and accepted.online is None:
            self._set_online(accepted, True)  # no availability topic: it is there as far as anyone can tell
        self._announce(accepted)

    def _claims(self, older_than: Accepted | None = None) -> list[claims.Claim]:
        """The accepted Devices' topics (only those of Devices older than `older_than`, when given)."""
        def age(a: Accepted) -> tuple[str, str]:
            return (a.created or "~", a.name)
        return [claims.Claim(a.name, a.device_id, a.command_topics, a.granted) for a in self.accepted.values()
                if older_than is None or (a is not older_than and age(a) < age(older_than))]

    def _screened(self, discovered: Discovered, held: list[claims.Claim]) -> Discovered:
        screened, said = claims.screen(discovered, self.settings.prefix, held)
        for sentence in said:
            log.warning("left out of the candidate: %s", sentence)
        return screened

    def _forget(self, accepted: Accepted) -> None:
        self.link.unsubscribe([f"{self.settings.prefix}/{accepted.device_id}/cmd"])
        self.link.forget(f"{self.settings.prefix}/{accepted.device_id}/info")
        if accepted.bridged is not None:
            topics = [*accepted.bridged.topics.state, *accepted.bridged.topics.availability]
            self.link.unsubscribe(topics)
            for topic in topics:
                self._by_topic.pop(topic, None)
        if accepted.presence is not None:
            asyncio.get_running_loop().run_in_executor(None, accepted.presence.close)

    def _announce(self, accepted: Accepted) -> None:
        if accepted.bridged is None or not self.link.connected.is_set():
            return
        info = json.dumps(accepted.bridged.contract.model_dump(mode="json", exclude_none=True),
                          separators=(",", ":"), sort_keys=True)
        if info != accepted.announced:
            self.link.publish(f"{self.settings.prefix}/{accepted.device_id}/info", info, retain=True)
            accepted.announced = info

    def _set_online(self, accepted: Accepted, online: bool) -> None:
        accepted.online = online
        if accepted.presence is not None:
            accepted.presence.set(online)

    # The device's own messages -----------------------------------------------------------

    def _device_message(self, accepted: Accepted, message: Arrived) -> None:
        bridged = accepted.bridged
        if bridged is None:
            return
        available = bridged.availability(message.topic, message.payload)
        if available is not None:
            self._set_online(accepted, available)
        readings = bridged.readings(message.topic, message.payload)
        if not readings:
            return
        actuators = {a.id for a in bridged.contract.actuators}
        metrics = {s.metric for s in bridged.contract.sensors}
        samples = [{"metric": k, "value": v, "ts": int(time.time() * 1000)} for k, v in readings.items()
                   if k in metrics and not message.retained]
        for actuator_id, value in readings.items():
            if actuator_id not in actuators:
                continue
            if not message.retained:
                accepted.commands.heard(actuator_id)
            for command_id, (wait, _execute) in list(accepted.waiting.items()):
                if wait.actuator == actuator_id and isinstance(
                        wait.on_state(value, message.retained, message.at), Confirmed):
                    accepted.state[actuator_id] = value
                    self._finish(accepted, command_id)
            if not (message.retained and actuator_id in accepted.state):
                # The latest the device said (an old retained state does not overwrite what it told us since).
                accepted.state[actuator_id] = value
        if samples:
            now = int(time.time() * 1000)
            self.link.publish(f"{self.settings.prefix}/{accepted.device_id}/telemetry",
                              json.dumps({"ts": now, "samples": samples}, separators=(",", ":")), qos=0)

    # Commands -------------------------------------------------------------------------------

    def _command(self, accepted: Accepted, payload: bytes) -> None:
        contract = accepted.bridged.contract if accepted.bridged is not None else None
        what = accepted.commands.receive(payload, contract, accepted.state)
        if isinstance(what, Answer):
            self._ack(accepted, what.ack)
            return
        if what is None or accepted.bridged is None:
            return
        publishes = accepted.bridged.command(what.actuator.id, what.value)
        outside = [topic for topic, _ in publishes if topic not in accepted.granted]
        theirs = claims.taken(accepted.device_id, [topic for topic, _ in publishes], self._claims(older_than=accepted))
        if outside or theirs:
            error = (f"{what.actuator.id}'s command topic {', '.join(outside)} is not among the topics a person accepted "
                     "for this device" if outside else f"{what.actuator.id}: {'; '.join(theirs)}")
            log.warning("command %s for %s refused: %s", what.id, accepted.device_id, error)
            self._ack(accepted, accepted.commands.finish(what.id, False, error + "; nothing was published",
                                                         accepted.state))
            return
        key = accepted.key
        echoes = 1 if key is not None and self.catalog.optimistic(key) else 0
        published_at = time.monotonic()
        wait = Confirmation(what.actuator.id, what.value, published_at, self.settings.confirm_timeout_s,
                            previous=accepted.state.get(what.actuator.id, UNKNOWN), echoes=echoes,
                            matches=accepted.bridged.matches(what.actuator.id))
        accepted.waiting[what.id] = (wait, what)
        # Once: the payload is never published again for this command id, whatever happens next.
        for topic, body in publishes:
            self.link.publish(topic, body, qos=1, retain=False)
        loop = asyncio.get_running_loop()
        loop.call_at(loop.time() + self.settings.confirm_timeout_s, self._finish, accepted, what.id)

    def _finish(self, accepted: Accepted, command_id: str) -> None:
        entry = accepted.waiting.pop(command_id, None)
        if entry is None:
            return
        wait, execute = entry
        outcome = wait.on_timeout()
        if isinstance(outcome, Confirmed):
            ack = accepted.commands.finish(command_id, True, None, accepted.state, note=outcome.note)
        else:
            ack = accepted.commands.finish(command_id, False, outcome.error, accepted.state)
            # Never published twice: the controller drives a target that stays set again, with a new id.
            accepted.commands.not_confirmed(wait.actuator, execute.value, outcome.error)
        self._ack(accepted, ack)

    def _ack(self, accepted: Accepted, ack: dict[str, Any]) -> None:
        self.link.publish(f"{self.settings.prefix}/{accepted.device_id}/ack",
                          json.dumps(ack, separators=(",", ":")), qos=1)

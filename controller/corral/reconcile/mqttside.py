"""The controller's MQTT side: the link to the broker, the command driver, the intake of device messages, and,
when the controller keeps the broker's accounts, the enrollments they follow and the refusals it traces.

Apart from the controller's wiring (reconcile/controller.py) because this is one side of it with a life of its
own: it is built from what the Kubernetes side knows (the Devices, the trust in contracts), queues device ids
on the Device queue, and starts after every guard was listed, the enrollments first. Everything here runs on
the event loop; the link's callbacks cross over with `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from corral.client.enroll import DEVICE_ID_LABEL
from corral.devices.accounts import RESPONSE_TOPIC
from corral.devices.bridge_accounts import BRIDGE_LABEL
from corral.devices.heartbeat import Heartbeat
from corral.devices.limits import DeviceLimits
from corral.devices.link import Inbound, MqttLink, TlsFiles
from corral.devices.topics import Topics
from corral.kube.client import AsyncApi
from corral.kube.informer import Informer
from corral.kube.workqueue import WorkQueue
from corral.reconcile.config import ControllerConfig
from corral.reconcile.devices.accounts import BrokerAccounts
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.driver import Driver
from corral.reconcile.devices.ingest import Ingest
from corral.reconcile.devices.notices import DeviceNotices
from corral.reconcile.devices.refusals import RefusalTracer
from corral.reconcile.devices.runtime import Fleet
from corral.reconcile.devices.trust import ContractTrust
from corral.reconcile.doors import OPEN, Doors
from corral.reconcile.rules.inputs import RuleInputs

ENROLLMENTS_LISTED_S = 60
RULE_WAKING = ("telemetry", "status", "ack", "info")  # a device's messages that may change what a Rule reads


class MqttSide:
    """The broker link and everything that hears devices through it; device ids go on `queue`."""

    def __init__(self, config: ControllerConfig, api: AsyncApi, fleet: Fleet, devices: DeviceCache,
                 queue: WorkQueue[str], notices: DeviceNotices, trust: ContractTrust,
                 signing_keys: Mapping[str, Ed25519PublicKey] | None = None, doors: Doors = OPEN) -> None:
        self.doors = doors
        # The Rules' inputs (reconcile/rules/inputs.py): their messages wake the Rules that read them, and the
        # telemetry of those another replica owns is kept here all the same, for whichever replica leads.
        self.rule_inputs: RuleInputs | None = None
        self.on_rule_input: Callable[[str], None] = lambda device_id: None
        self.topics = topics = Topics(config.topic_prefix)
        tls = TlsFiles(config.mqtt_ca_file, config.mqtt_cert_file, config.mqtt_key_file)
        extra = (RESPONSE_TOPIC,) if config.manage_broker_accounts else ()
        self.link = MqttLink(config.mqtt_url, topics, self._on_message, on_connected=self._on_connected,
                             extra_subscriptions=extra, tls=tls, password=config.mqtt_password,
                             heartbeat=Heartbeat.on(topics, config.heartbeat_interval_s))
        self.driver = Driver(self.link, topics, config.command_timeout_s, doors)
        self.ingest = Ingest(topics, fleet, queue, self.driver, notices, config.coalescing,
                             bound=lambda device_id: bool(devices.bound(device_id)), trust=trust,
                             require_signatures=config.require_signatures, signing_keys=signing_keys,
                             limits=DeviceLimits(config.device_message_rate, config.device_message_burst),
                             barred=lambda device_id: self.accounts is not None and self.accounts.barred(device_id))
        # PUBLISHes the broker refused, from its debug log: counted, recorded and told per device and burst.
        self.refusals = RefusalTracer(Path(config.broker_log), topics, notices,
                                      enrolled=lambda client: bool(devices.bound(client)),
                                      on_presence=self.ingest.on_broker_presence) \
            if config.broker_log else None
        # A device the broker throws off for an account change sends no Will: its status follows the broker's answer.
        self.accounts = BrokerAccounts(self.link, topics, notices, config.max_devices_per_namespace,
                                       on_kicked=self.ingest.disconnected, devices=devices.devices,
                                       home_namespace=os.environ.get("POD_NAMESPACE", ""),
                                       bridge_namespaces=config.bridge_namespaces,
                                       controller_username=urlsplit(config.mqtt_url).username or "") \
            if config.manage_broker_accounts else None
        self.enrollments = Informer(api, "", "v1", "secrets", DEVICE_ID_LABEL, config.watch_namespaces,
                                    self.accounts.on_secret) if self.accounts is not None else None
        # Bridged sources' and the bridge's accounts (devices.bridge_accounts): Secrets of their own label.
        # Every watched namespace, and the bridge namespaces: a bridge Secret elsewhere is refused, on the Secret.
        bridge_watch = tuple(dict.fromkeys((*config.watch_namespaces, *config.bridge_namespaces))) \
            if config.watch_namespaces else ()
        self.bridge_secrets = Informer(api, "", "v1", "secrets", BRIDGE_LABEL, bridge_watch,
                                       self.accounts.on_secret) if self.accounts is not None else None

    def connected(self) -> bool:
        return self.link.connected.is_set()

    def up_since(self) -> float:
        return self.ingest.link_up_since

    async def start(self, lead: bool = True) -> None:
        """`lead`: keep the broker's accounts from the start (a controller alone); a replica that may not lead
        follows the enrollments (to know who is barred) and keeps the accounts only while it leads (`lead`)."""
        if self.accounts is not None and self.enrollments is not None:
            # The enrollments first: the first thing the controller tells a fresh broker is who may connect.
            self.enrollments.start()
            if self.bridge_secrets is not None:
                self.bridge_secrets.start()
            await asyncio.wait_for(self.enrollments.synced.wait(), ENROLLMENTS_LISTED_S)
            if self.bridge_secrets is not None:
                await asyncio.wait_for(self.bridge_secrets.synced.wait(), ENROLLMENTS_LISTED_S)
            if lead:
                self.accounts.start()
        await self.link.start()
        if self.refusals is not None:
            self.refusals.start()

    def lead(self) -> None:
        """Became the leader: keep the broker's accounts, re-synced from the enrollment Secrets at once."""
        if self.accounts is not None:
            self.accounts.start()

    async def follow(self) -> None:
        """No longer the leader: leave the broker's accounts to the one that is."""
        if self.accounts is not None:
            await self.accounts.stop()

    def redeliver(self) -> None:
        """Subscribe again to the devices' retained info and status, which the broker then sends again: a shard
        just acquired learns its devices' contracts and presence as they are now."""
        self.link.resubscribe(("info", "status"))

    async def stop_accounts(self) -> None:
        if self.accounts is not None and self.enrollments is not None:
            await self.accounts.stop()
            await self.enrollments.stop()
            if self.bridge_secrets is not None:
                await self.bridge_secrets.stop()

    async def stop(self) -> None:
        """After `stop_accounts` and the Kubernetes side: the link goes last, with the intake."""
        if self.refusals is not None:
            await self.refusals.stop()
        await self.link.stop()
        self.ingest.close()

    def _on_message(self, message: Inbound) -> None:
        if message.topic == RESPONSE_TOPIC:
            if self.accounts is not None:
                self.accounts.on_response(message.payload)
            return
        parsed = self.topics.parse(message.topic)
        if self.doors.sharded and parsed is not None and not self.doors.owns(parsed[0]):
            # Another replica's device: dropped before its payload is read (a topic split and a hash). An unknown
            # device's enrollment is its id's shard's owner's too. Acks still pass while a shard drains. Only the
            # telemetry of a Rule's input is kept (its newest sample per metric), for the leader's Rules.
            device_id, kind = parsed
            inputs = self.rule_inputs
            if kind == "telemetry" and inputs is not None and inputs.is_input(device_id) \
                    and inputs.kept.keep(device_id, message.payload):
                self.on_rule_input(device_id)
            return
        self.ingest.on_message(message)
        if parsed is not None and parsed[1] in RULE_WAKING:
            self.on_rule_input(parsed[0])

    def _on_connected(self) -> None:
        if self.accounts is not None:
            self.accounts.on_connected()
        self.ingest.on_connected()

"""The controller, assembled: the MQTT intake, the caches, the two reconcilers and their work queues.

Inputs only ever queue keys. MQTT messages (`ingest`) and Device watch events queue a device id for
`device.DeviceReconciler`; Intent and Approval watch events queue an Intent for
`intents.IntentReconciler`, which hands what it decides to execute to a queue per Device. Interlocks
(`interlocks.Interlocks`, an informer of their own) are judged by both, and a changed one queues the
Devices of its namespace. Watch events pass a generation predicate (kubebuilder's): a Device is reconciled
when its spec changed, not when only its status, labels or annotations did, and never for the controller's
own writes, whose answers the caches hold already.

Everything here runs on one event loop; MQTT callbacks cross over with `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from corral.api.codes import CONTROLLER_MANAGER
from corral.audit.component import AuditSettings, assemble
from corral.audit.decisions import DecisionIndex
from corral.audit.log import read_records
from corral.client.enroll import DEVICE_ID_LABEL
from corral.devices.accounts import RESPONSE_TOPIC
from corral.devices.heartbeat import Heartbeat
from corral.devices.limits import DeviceLimits
from corral.devices.link import Inbound, MqttLink, TlsFiles
from corral.devices.topics import Topics
from corral.kube.access import AccessReviews
from corral.kube.cache import Body
from corral.kube.events import EventRecorder
from corral.kube.informer import Informer
from corral.kube.objects import Kube
from corral.kube.workqueue import WorkQueue, run_workers
from corral.notify.sender import Notifier
from corral.reconcile.config import ControllerConfig
from corral.reconcile.devices.accounts import BrokerAccounts
from corral.reconcile.devices.cache import DeviceCache, device_id_of
from corral.reconcile.devices.capabilities import Capabilities
from corral.reconcile.devices.driver import Driver
from corral.reconcile.devices.ingest import Ingest
from corral.reconcile.devices.notices import DeviceNotices
from corral.reconcile.devices.port import FleetPort
from corral.reconcile.devices.reconciler import DeviceReconciler, Listening
from corral.reconcile.devices.refusals import RefusalTracer
from corral.reconcile.devices.runtime import Fleet
from corral.reconcile.devices.targets import TargetApplier
from corral.reconcile.devices.trust import ContractTrust
from corral.reconcile.guards.interlocks import Interlocks
from corral.reconcile.guards.leases import Leases
from corral.reconcile.guards.pauses import AgentPauses
from corral.reconcile.intents.reconciler import IntentReconciler, IntentSettings
from corral.serving.auth import Reviews
from corral.serving.certs import ensure_serving_certificate
from corral.serving.server import ReadServer

log = logging.getLogger(__name__)


class Controller:
    def __init__(self, config: ControllerConfig, intent_settings: IntentSettings, kube: Kube, recorder: EventRecorder,
                 signing_keys: Mapping[str, Ed25519PublicKey] | None = None) -> None:
        self.config = config
        self.kube = kube
        self.fleet = Fleet()
        self.devices = DeviceCache()
        self.queue: WorkQueue[str] = WorkQueue("devices")
        topics = Topics(config.topic_prefix)
        tls = TlsFiles(config.mqtt_ca_file, config.mqtt_cert_file, config.mqtt_key_file)
        extra = (RESPONSE_TOPIC,) if config.manage_broker_accounts else ()
        self.link = MqttLink(config.mqtt_url, topics, self._on_mqtt, on_connected=self._on_connected,
                             extra_subscriptions=extra, tls=tls, password=config.mqtt_password,
                             heartbeat=Heartbeat.on(topics, config.heartbeat_interval_s))
        self.driver = Driver(self.link, topics, config.command_timeout_s)
        key_file = Path(config.audit_key_file)
        self.audit, self.checkpoints = assemble(AuditSettings(
            Path(config.audit_dir), key_file, config.audit_key_name, config.audit_create_key, config.audit_checkpoint,
            config.audit_checkpoint_interval_s, config.audit_max_bytes, config.audit_max_file_age_s,
            config.audit_retention), kube.api, CONTROLLER_MANAGER)
        self.recorded = DecisionIndex()
        self.audit.on_record(self.recorded.add)
        notices = DeviceNotices(recorder, self.devices, self.audit)
        # Capabilities are cluster-scoped: only a controller that sees every Device may say one is unused.
        self.capabilities = Capabilities(kube, recorder, self.devices, config.capability_grace_s,
                                         sees_every_namespace=not config.watch_namespaces,
                                         announced=self._announced_capabilities)
        trust = ContractTrust(self.capabilities, self.devices, config.risk_floors,
                              check_versions=config.require_signatures,
                              freshness=intent_settings.policy.freshness_rule())
        self.ingest = Ingest(topics, self.fleet, self.queue, self.driver, notices, config.coalescing,
                             bound=lambda device_id: bool(self.devices.bound(device_id)), trust=trust,
                             require_signatures=config.require_signatures, signing_keys=signing_keys,
                             limits=DeviceLimits(config.device_message_rate, config.device_message_burst),
                             barred=lambda device_id: self.accounts is not None and self.accounts.barred(device_id))
        # PUBLISHes the broker refused, from its debug log: counted, recorded and told per device and burst.
        self.refusals = RefusalTracer(Path(config.broker_log), topics, notices,
                                      enrolled=lambda client: bool(self.devices.bound(client)),
                                      on_presence=self.ingest.on_broker_presence) \
            if config.broker_log else None
        # A device the broker throws off for an account change sends no Will: its status follows the broker's answer.
        self.accounts = BrokerAccounts(self.link, topics, notices, config.max_devices_per_namespace,
                                       on_kicked=self.ingest.disconnected) \
            if config.manage_broker_accounts else None
        self.enrollments = Informer(kube.api, "", "v1", "secrets", DEVICE_ID_LABEL, config.watch_namespaces,
                                    self.accounts.on_secret) if self.accounts is not None else None
        listening = Listening(connected=self.link.connected.is_set, up_since=lambda: self.ingest.link_up_since)
        self.access = AccessReviews(kube)
        self.applier = TargetApplier(kube)
        port = FleetPort(self.fleet, self.devices, self.driver, self.applier, self.queue, notices, listening, trust)
        # Cross-device rules: judged when Intents are decided and executed, and before any target is driven.
        self.interlocks = Interlocks(kube, self.devices, config.watch_namespaces, on_change=self._interlocks_changed)
        # Exclusive control of Devices: Lease objects only the controller writes (reconcile/guards/leases.py). A lease that
        # ends lets the Device's held targets be driven.
        self.leases = Leases(kube.api, config.watch_namespaces, on_change=self._lease_changed)
        self.device_reconciler = DeviceReconciler(config, kube, self.fleet, self.devices, self.driver, notices,
                                                  recorder, listening, trust, self.interlocks, port.view,
                                                  leased=lambda namespace, name: self.leases.guard(namespace, name)[0])
        # Approval requests to the configured webhooks, sent off the decision path (notify/sender.py).
        self.notifier = Notifier(config.notifications, config.console_url, recorder) \
            if config.notifications is not None else None
        # The agents kill switch of each namespace (AgentPause): a change decides its undecided Intents again.
        self.pauses = AgentPauses(kube, config.watch_namespaces, self.audit, recorder,
                                  on_change=lambda namespace: self.intents.on_pause_change(namespace))
        self.intents = IntentReconciler(intent_settings, kube, self.access, recorder, port, self.audit, self.recorded,
                                        self.interlocks,
                                        on_awaiting=self.notifier.waiting if self.notifier is not None else None,
                                        leases=self.leases, pauses=self.pauses)
        self._workers: list[asyncio.Task[None]] = []
        self.server: ReadServer | None = None
        if config.serve_port:
            cert, key_pem = config.serve_cert_file, config.serve_key_file
            if not cert or not key_pem:
                made = ensure_serving_certificate(key_file.parent)
                cert, key_pem = str(made.cert_file), str(made.key_file)
            self.server = ReadServer(Reviews(kube.api, self.access), Path(config.audit_dir), config.serve_port, cert,
                                     key_pem, host=config.serve_host, source=port, front_proxy=config.front_proxy)

    async def start(self) -> None:
        namespaces = self.config.watch_namespaces
        await asyncio.to_thread(self._open_audit)
        log.info("audit log %s continues at seq %d; %d recent decision(s) read back", self.audit.directory,
                 self.audit.chain.seq, len(self.recorded))
        # Know every existing Device before the first retained `info` arrives; otherwise a device that a
        # person already bound under another name would be registered a second time. And know every Intent
        # that was executing, so its command is resent with its own id, and nothing else is sent for it.
        for body in await self.kube.list_objects("devices", namespaces):
            self.on_device_event("ADDED", body)
        intents = await self.kube.list_objects("intents", namespaces)
        self.recorded.keep_only({body["metadata"]["uid"] for body in intents})
        self.intents.prime(intents)
        self.checkpoints.start()
        if self.server is not None:
            await self.server.start()
        # A changed contract is judged against the accepted one, which a Capability holds.
        await self.capabilities.prime()
        self.capabilities.start()
        # Every Interlock, pause and lease before anything is decided or driven: a rule, a pause or a lease not
        # yet read must not be one missed.
        await _listed(self.interlocks.start, self.interlocks.synced, "Interlocks",
                      "is the CRD interlocks.corral.dev installed, and may the controller list and watch interlocks?")
        await _listed(self.pauses.start, self.pauses.synced, "AgentPauses",
                      "is the CRD agentpauses.corral.dev installed, and may the controller list and watch agentpauses?")
        await _listed(self.leases.start, self.leases.synced, "Leases",
                      "may the controller list and watch leases (coordination.k8s.io)?")
        if self.accounts is not None and self.enrollments is not None:
            # The enrollments first: the first thing the controller tells a fresh broker is who may connect.
            self.enrollments.start()
            await asyncio.wait_for(self.enrollments.synced.wait(), 60)
            self.accounts.start()
        await self.link.start()
        if self.refusals is not None:
            self.refusals.start()
        if self.notifier is not None:
            await self.notifier.start()
        settings = self.intents.settings
        self._workers = [
            asyncio.create_task(run_workers(self.queue, self.device_reconciler.reconcile, self.config.workers),
                                name="corral-devices"),
            asyncio.create_task(run_workers(self.intents.decisions, self.intents.decide, settings.decision_workers),
                                name="corral-intents"),
            asyncio.create_task(run_workers(self.intents.executions, self.intents.execute,
                                            settings.execution_workers), name="corral-executions"),
        ]

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        for queue in (self.queue, self.intents.decisions, self.intents.executions):
            queue.close()
        if self.notifier is not None:
            await self.notifier.stop()
        if self.accounts is not None and self.enrollments is not None:
            await self.accounts.stop()
            await self.enrollments.stop()
        await self.capabilities.stop()
        await self.interlocks.stop()
        await self.pauses.stop()
        await self.leases.stop()
        if self.refusals is not None:
            await self.refusals.stop()
        await self.link.stop()
        self.ingest.close()
        await self.checkpoints.stop()  # the final one: after everything that could still write a record
        self.audit.close()

    def _open_audit(self) -> None:
        self.audit.open()
        since = datetime.now(UTC) - timedelta(seconds=self.config.audit_lookback_s)
        self.recorded.load(r for r in read_records(self.audit.directory, since) if r.at >= since)

    def _announced_capabilities(self) -> set[str]:
        return {name for rt in self.fleet.values() for name in (rt.capability, rt.accepted_capability) if name}

    @property
    def healthy(self) -> bool:
        return self.link.connected.is_set() and all(not task.done() for task in self._workers)

    # ---- inputs ---------------------------------------------------------------------------------------------

    def on_device_event(self, event_type: str, body: Body) -> None:
        if event_type == "DELETED":
            old = self.devices.remove(body)
            device_id = device_id_of(old or body)
            if device_id:
                self.queue.add(device_id)
            return
        change = self.devices.upsert(body)
        if change is None or not change.generation_changed:
            return  # an older copy, or only status, labels or annotations changed: nothing to drive
        device_id = device_id_of(body)
        if device_id:
            self.ingest.adopt(device_id)  # it may have announced itself before it was enrolled
            self.queue.add(device_id)
        if change.before is not None and device_id_of(change.before) not in (None, device_id):
            self.queue.add(device_id_of(change.before) or "")

    def _interlocks_changed(self, namespace: str) -> None:
        """The namespace's rules changed: its Devices list them in status, and judge their targets anew."""
        for (ns, _name), body in self.devices.items():
            device_id = device_id_of(body)
            if ns == namespace and device_id:
                self.queue.add(device_id)

    def _lease_changed(self, namespace: str, name: str) -> None:
        body = self.devices.get((namespace, name))
        device_id = device_id_of(body) if body is not None else None
        if device_id:
            self.queue.add(device_id)

    def on_intent_event(self, event_type: str, body: Body) -> None:
        self.intents.on_intent_event(event_type, body)

    def on_approval_event(self, event_type: str, body: Body) -> None:
        self.intents.on_approval_event(event_type, body)

    def on_grant_event(self, event_type: str, body: Body) -> None:
        self.intents.on_grant_event(event_type, body)

    def _on_mqtt(self, message: Inbound) -> None:
        if message.topic == RESPONSE_TOPIC:
            if self.accounts is not None:
                self.accounts.on_response(message.payload)
            return
        self.ingest.on_message(message)

    def _on_connected(self) -> None:
        if self.accounts is not None:
            self.accounts.on_connected()
        self.ingest.on_connected()


async def _listed(start: Callable[[], None], synced: asyncio.Event, what: str, hint: str) -> None:
    """Start a watch and wait for its first list of every namespace; a clear error when it never comes."""
    start()
    try:
        await asyncio.wait_for(synced.wait(), 60)
    except TimeoutError:
        raise RuntimeError(f"the {what} could not be listed within 60 s: {hint}") from None

"""The controller, wired as controller-runtime's builder wires one: which watch events become which keys on which
queue, which reconciler works each queue, then start and stop.

Three queues, each worked by one reconciler (`async def reconcile(key) -> Result`):

- `devices` (device ids), worked by `devices.DeviceReconciler`. Keys come from the MQTT side (`mqttside.py`:
  a device's messages), from Device watch events that passed a generation predicate (kubebuilder's: a Device is
  reconciled when its spec changed, not when only its status, labels or annotations did, and never for the
  controller's own writes, whose answers the caches hold already), from a changed Interlock (every Device of its
  namespace) and from a changed lease (its Device): devices/wiring.py maps each of those events to device ids.
- `decisions` and `executions` (Intents), worked by the Intent controller's two reconcilers (intents/wiring.py).
  Keys come from Intent, Approval and ApprovalGrant watch events and from a changed AgentPause (the undecided
  Intents of its namespace); a decision to execute queues the Intent for execution.

Several replicas (`--leader-elect`, docs/scale.md): each queue's reconciler sits behind a gate that drops keys of
devices this replica does not own, and the `Ownership` (scale/) tells, through its callbacks, when a shard was
acquired, is being released or was lost (`shardwork.py`); every effect passes a door (`doors.py`). A controller
alone is `Standalone`: every gate and door open.

The guards (Interlocks, leases, AgentPauses: reconcile/guards) are listed before anything is decided or driven.
What each event queues is declared here (`_watch` and the `on_*_event` inputs), not inside the reconcilers.
Everything runs on one event loop; the MQTT side's callbacks cross over with `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from corral.api.codes import CONTROLLER_MANAGER
from corral.audit.component import AuditSettings, assemble
from corral.audit.decisions import DecisionIndex
from corral.audit.log import AuditLog, read_records
from corral.audit.requests import RequestNames
from corral.audit.signer import CheckpointSigner
from corral.kube.access import AccessReviews
from corral.kube.cache import Body
from corral.kube.events import EventRecorder
from corral.kube.objects import Kube
from corral.kube.workqueue import WorkQueue, run_workers
from corral.notify.sender import Notifier
from corral.reconcile.config import ControllerConfig
from corral.reconcile.devices.cache import DeviceCache, key_of_device
from corral.reconcile.devices.capabilities import Capabilities
from corral.reconcile.devices.ingest import Ingest
from corral.reconcile.devices.listening import Listening
from corral.reconcile.devices.notices import DeviceNotices
from corral.reconcile.devices.port import FleetPort
from corral.reconcile.devices.reconciler import DeviceReconciler
from corral.reconcile.devices.runtime import Fleet
from corral.reconcile.devices.targets import TargetApplier
from corral.reconcile.devices.trust import ContractTrust
from corral.reconcile.devices.wiring import DeviceEvents
from corral.reconcile.doors import Doors
from corral.reconcile.guards.interlocks import Interlocks
from corral.reconcile.guards.leases import Leases
from corral.reconcile.guards.pauses import AgentPauses
from corral.reconcile.history import HistoryFeed, history_file
from corral.reconcile.intents.settings import IntentSettings
from corral.reconcile.intents.wiring import IntentController
from corral.reconcile.mqttside import MqttSide
from corral.reconcile.rules.wiring import rules_controller
from corral.reconcile.shardlabels import ShardLabels
from corral.reconcile.shardwork import ShardWork
from corral.scale.ownership import Ownership, Standalone
from corral.scale.settings import ScaleSettings
from corral.serving.auth import Reviews
from corral.serving.certs import ensure_serving_certificate
from corral.serving.server import ReadServer

log = logging.getLogger(__name__)

GUARDS_LISTED_S = 60
# How long a replica waits for its first MQTT connection before it competes for shards anyway (a standby should be
# warm, but a broker that is away must not keep a replica from leading what it can).
WARM_S = 30


class Controller:
    def __init__(self, config: ControllerConfig, intent_settings: IntentSettings, kube: Kube, recorder: EventRecorder,
                 signing_keys: Mapping[str, Ed25519PublicKey] | None = None, ownership: Ownership | None = None) -> None:
        self.config, self.kube = config, kube
        self.fleet, self.devices = Fleet(), DeviceCache()
        self.ownership = ownership if ownership is not None else _ownership(config.scale, kube)
        self.doors = Doors(self.ownership, self.devices, ShardLabels(kube, self.ownership.shards))
        self.queue: WorkQueue[str] = WorkQueue("devices")
        self.audit, self.checkpoints = _audit(config, kube)
        self.recorded = DecisionIndex()
        self.audit.on_record(self.recorded.add)
        # By Intent name, for the idempotency window; never pruned to the Intents that exist (audit/requests.py).
        self.names = RequestNames(timedelta(seconds=config.idempotency_window_s))
        self.audit.on_record(self.names.add)
        notices = DeviceNotices(recorder, self.devices, self.audit)
        # Capabilities are cluster-scoped: only a controller that sees every Device may say one is unused.
        self.capabilities = Capabilities(kube, recorder, self.devices, config.capability_grace_s,
                                         sees_every_namespace=not config.watch_namespaces,
                                         announced=self._announced_capabilities)
        trust = ContractTrust(self.capabilities, self.devices, config.risk_floors,
                              check_versions=config.require_signatures,
                              freshness=intent_settings.policy.freshness_rule())
        self.mqtt = MqttSide(config, kube.api, self.fleet, self.devices, self.queue, notices, trust, signing_keys,
                             doors=self.doors)
        listening = Listening(connected=self.mqtt.connected, up_since=self.mqtt.up_since)
        self.access = AccessReviews(kube)
        self.applier = TargetApplier(kube)
        self.applier.doors = self.doors
        self.port = port = FleetPort(self.fleet, self.devices, self.mqtt.driver, self.applier, self.queue, notices,
                                     listening, trust)
        namespaces = config.watch_namespaces
        # Cross-device rules: judged when Intents are decided and executed, and before any target is driven.
        self.interlocks = Interlocks(kube, self.devices, namespaces)
        # Exclusive control of Devices: Lease objects only the controller writes (reconcile/guards/leases.py).
        self.leases = Leases(kube.api, namespaces)
        # The agents kill switch of each namespace (AgentPause).
        self.pauses = AgentPauses(kube, namespaces, self.audit, recorder)
        self.device_reconciler = DeviceReconciler(config, kube, self.fleet, self.devices, self.mqtt.driver, notices,
                                                  recorder, listening, trust, self.interlocks, port.view,
                                                  leased=lambda namespace, name: self.leases.guard(namespace, name)[0])
        # Approval requests to the configured webhooks, sent off the decision path (notify/sender.py).
        self.notifier = Notifier(config.notifications, config.console_url, recorder) \
            if config.notifications is not None else None
        self.intents = IntentController(intent_settings, kube, self.access, recorder, port, self.audit, self.recorded,
                                        self.interlocks,
                                        on_awaiting=self.notifier.waiting if self.notifier is not None else None,
                                        leases=self.leases, pauses=self.pauses, names=self.names)
        # The doors of status writes: only a device's owner writes its Device's and its Intents' status.
        self.device_reconciler.writer.doors = self.intents.outcomes.doors = self.doors
        self.history = _history(config, self.devices, self.mqtt.ingest)  # samples over time, with --history-dir
        self.server = _read_server(config, kube, self.access, port, self.history)
        self._workers: list[asyncio.Task[None]] = []
        self.shards = ShardWork(self.doors, self.devices, self.fleet, self.queue, self.device_reconciler,
                                self.intents, port, self.mqtt, self.capabilities, config.command_timeout_s)
        # Rules: evaluated by the leader, acting through Intents in their ServiceAccounts' names (docs/rules.md).
        self.rules = rules_controller(kube, namespaces, self.audit, recorder, intent_settings.policy.people,
                                      self.access, self.devices, port.view, self.pauses, trust,
                                      self.intents.reconciler.gatherer, self.ownership.is_leader, self.doors.owns)
        self.mqtt.rule_inputs, self.mqtt.on_rule_input = self.rules.inputs, self.rules.on_input
        self._watch()
        self.ownership.set_callbacks(self._acquired, self.shards.releasing, self.shards.lost)

    # ---- what each event queues -----------------------------------------------------------------------------

    def _watch(self) -> None:
        """The guards' changes, mapped to keys. The kinds kopf watches come in through the `on_*_event` inputs."""
        # Device ids (devices/wiring.py): a Device's own events pass the generation predicate; a namespace's changed
        # rules queue its Devices (their status lists them, their targets are judged anew); a lease that changed
        # queues its Device (a target held for it may be driven now).
        self.device_events = DeviceEvents(self.devices, self.queue, adopt=self.mqtt.ingest.adopt)
        self.interlocks.on_change = self.device_events.on_interlocks_changed
        self.leases.on_change = self.device_events.on_lease_changed
        # A pause (or its end) decides the namespace's undecided Intents again.
        self.pauses.on_change = self.intents.on_pause_change

    def on_device_event(self, event_type: str, body: Body) -> None:
        self.device_events.on_device_event(event_type, body)
        self.rules.on_device_event(body)

    def on_intent_event(self, event_type: str, body: Body) -> None:
        self.intents.on_intent_event(event_type, body)
        self.rules.on_intent_event(event_type, body)

    async def _acquired(self, shard: int) -> None:
        await self.shards.acquired(shard)
        if shard == 0:
            self.rules.requeue_all()  # the leader evaluates the Rules

    def on_approval_event(self, event_type: str, body: Body) -> None:
        self.intents.on_approval_event(event_type, body)

    def on_grant_event(self, event_type: str, body: Body) -> None:
        self.intents.on_grant_event(event_type, body)

    # ---- start and stop -------------------------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(self._open_audit)
        log.info("audit log %s continues at seq %d; %d recent decision(s) and %d Intent name(s) of the idempotency "
                 "window read back", self.audit.directory, self.audit.chain.seq, len(self.recorded), len(self.names))
        await self._prime()
        if self.history is not None:
            await self.history.open()
        self.checkpoints.start()
        if self.server is not None:
            await self.server.start()
        # A changed contract is judged against the accepted one, which a Capability holds.
        await self.capabilities.prime()
        await self._list_guards()
        alone = not self.doors.sharded
        await self.mqtt.start(lead=alone)
        if self.notifier is not None:
            await self.notifier.start()
        self._workers = self._run_workers()
        if alone:
            await self.shards.lead()
            return
        # Warm before competing: caches primed, guards listed, MQTT connected; the gates drop everything until a
        # shard is held, and its `acquired` queues its work again.
        try:
            await asyncio.wait_for(self.mqtt.link.connected.wait(), WARM_S)
        except TimeoutError:
            log.warning("no MQTT connection within %d s; competing for shards all the same", WARM_S)
        await self.ownership.start()
        log.info("as %s: holding shard(s) %s of %d%s", self.config.scale.identity, sorted(self.ownership.owned()),
                 self.ownership.shards, " (the leader)" if self.ownership.is_leader() else "")

    async def _prime(self) -> None:
        """Know every existing Device before the first retained `info` arrives; otherwise a device that a person
        already bound under another name would be registered a second time. And know every Intent that was
        executing, so its command is resent with its own id, and nothing else is sent for it."""
        namespaces = self.config.watch_namespaces
        for body in await self.kube.list_objects("devices", namespaces):
            self.on_device_event("ADDED", body)
        intents = await self.kube.list_objects("intents", namespaces)
        self.recorded.keep_only({body["metadata"]["uid"] for body in intents})
        self.intents.prime(intents)

    async def _list_guards(self) -> None:
        """Every Interlock, pause and lease before anything is decided or driven: a rule, a pause or a lease not
        yet read must not be one missed."""
        await _listed(self.interlocks.start, self.interlocks.synced, "Interlocks",
                      "is the CRD interlocks.corral.dev installed, and may the controller list and watch interlocks?")
        await _listed(self.pauses.start, self.pauses.synced, "AgentPauses",
                      "is the CRD agentpauses.corral.dev installed, and may the controller list and watch agentpauses?")
        await _listed(self.leases.start, self.leases.synced, "Leases",
                      "may the controller list and watch leases (coordination.k8s.io)?")
        await _listed(self.rules.start, self.rules.synced, "Rules",
                      "is the CRD rules.corral.dev installed, and may the controller list and watch rules?")

    def _run_workers(self) -> list[asyncio.Task[None]]:
        """Each queue and the reconciler that works it."""
        settings, intents, gated = self.intents.settings, self.intents, self.shards
        return [
            asyncio.create_task(run_workers(self.queue, gated.reconcile_device, self.config.workers),
                                name="corral-devices"),
            asyncio.create_task(run_workers(intents.decisions, gated.decide_intent, settings.decision_workers),
                                name="corral-intents"),
            asyncio.create_task(run_workers(intents.executions, gated.execute_intents, settings.execution_workers),
                                name="corral-executions"),
        ]

    async def stop(self) -> None:
        # First: hand every shard over now (SIGTERM), not a lease duration later.
        try:
            await self.ownership.stop()
        except Exception:
            log.exception("releasing the shards failed; their Leases expire after the lease duration")
        if self.server is not None:
            await self.server.stop()
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        for queue in (self.queue, self.intents.decisions, self.intents.executions):
            queue.close()
        if self.notifier is not None:
            await self.notifier.stop()
        await self.mqtt.stop_accounts()
        await self.capabilities.stop()
        await self.interlocks.stop()
        await self.pauses.stop()
        await self.leases.stop()
        await self.rules.stop()
        await self.mqtt.stop()
        if self.history is not None:
            await self.history.close()  # after the intake: what it staged last is written
        await self.checkpoints.stop()  # the final one: after everything that could still write a record
        self.audit.close()

    def _open_audit(self) -> None:
        self.audit.open()
        now = datetime.now(UTC)
        recent = now - timedelta(seconds=self.config.audit_lookback_s)
        window = now - self.names.window
        # One pass over every file still written to since the earlier of the two (rotated ones too).
        for record in read_records(self.audit.directory, min(recent, window)):
            if record.at >= recent:
                self.recorded.add(record)
            if record.at >= window:
                self.names.add(record)
        self.names.expire(now)

    def _announced_capabilities(self) -> set[str]:
        return {name for rt in self.fleet.values() for name in (rt.capability, rt.accepted_capability) if name}

    @property
    def healthy(self) -> bool:
        return self.mqtt.connected() and all(not task.done() for task in self._workers)


def _audit(config: ControllerConfig, kube: Kube) -> tuple[AuditLog, CheckpointSigner]:
    """The audit log (opened at start) and its checkpoint signer. Age retention keeps every file written to within
    the idempotency window: replays are answered from its `intent.decided` records (only the size budget may
    still delete them)."""
    retention = config.audit_retention
    if retention.max_age_s is not None and retention.max_age_s < config.idempotency_window_s:
        retention = replace(retention, max_age_s=config.idempotency_window_s)
    return assemble(AuditSettings(
        Path(config.audit_dir), Path(config.audit_key_file), config.audit_key_name, config.audit_create_key,
        config.audit_checkpoint, config.audit_checkpoint_interval_s, config.audit_max_bytes,
        config.audit_max_file_age_s, retention), kube.api, CONTROLLER_MANAGER)


def _history(config: ControllerConfig, devices: DeviceCache, ingest: Ingest) -> HistoryFeed | None:
    """The store of samples over time: ingest stages each sample it accepts, the readings server answers."""
    if config.history_dir is None:
        return None

    def owner(device_id: str) -> tuple[str, str] | None:
        claims = devices.claims(device_id)
        return key_of_device(claims[0]) if claims else None  # the oldest claim is the Device bound to it

    feed = HistoryFeed(history_file(config.history_dir, config.history_name), config.history_retention, owner,
                       config.history_flush_s, config.history_prune_s)
    ingest.history = feed.record
    return feed


def _read_server(config: ControllerConfig, kube: Kube, access: AccessReviews, port: FleetPort,
                 history: HistoryFeed | None = None) -> ReadServer | None:
    """The HTTPS server of audit records and readings, when a port is configured. It reads the devices through
    `port`, handed in here: serving/ imports nothing of reconcile/."""
    if not config.serve_port:
        return None
    cert, key_pem = config.serve_cert_file, config.serve_key_file
    if not cert or not key_pem:
        made = ensure_serving_certificate(Path(config.audit_key_file).parent)
        cert, key_pem = str(made.cert_file), str(made.key_file)
    return ReadServer(Reviews(kube.api, access), Path(config.audit_dir), config.serve_port, cert, key_pem,
                      host=config.serve_host, source=port, front_proxy=config.front_proxy, history=history)


async def _listed(start: Callable[[], None], synced: asyncio.Event, what: str, hint: str) -> None:
    """Start a watch and wait for its first list of every namespace; a clear error when it never comes."""
    start()
    try:
        await asyncio.wait_for(synced.wait(), GUARDS_LISTED_S)
    except TimeoutError:
        raise RuntimeError(f"the {what} could not be listed within {GUARDS_LISTED_S} s: {hint}") from None


def _ownership(settings: ScaleSettings, kube: Kube) -> Ownership:
    """A controller alone owns every device; with leader election, what it owns is the Leases it holds."""
    if not settings.enabled:
        return Standalone()
    from corral.scale.shards import ShardOwnership

    elected: Ownership = ShardOwnership(settings, kube.api)
    return elected

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
devices this replica does not own (`doors.py`), and the `Ownership` (scale/) tells, through its callbacks, when a
shard was acquired (its devices and unfinished Intents are queued again), is being released (its work in flight
ends first) or was lost. The leader (the holder of shard 0) alone keeps the broker's accounts and deletes unused
Capabilities. A controller alone is `Standalone`: every gate and door open.

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

from corral.api.codes import CONTROLLER_MANAGER, FINAL_PHASES
from corral.audit.component import AuditSettings, assemble
from corral.audit.decisions import DecisionIndex
from corral.audit.log import AuditLog, read_records
from corral.audit.requests import RequestNames
from corral.audit.signer import CheckpointSigner
from corral.kube.access import AccessReviews
from corral.kube.cache import Body, Key
from corral.kube.events import EventRecorder
from corral.kube.objects import Kube
from corral.kube.workqueue import Result, WorkQueue, run_workers
from corral.notify.sender import Notifier
from corral.reconcile.config import ControllerConfig
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.capabilities import Capabilities
from corral.reconcile.devices.listening import Listening
from corral.reconcile.devices.notices import DeviceNotices
from corral.reconcile.devices.port import FleetPort
from corral.reconcile.devices.reconciler import DeviceReconciler
from corral.reconcile.devices.runtime import Fleet
from corral.reconcile.devices.targets import TargetApplier
from corral.reconcile.devices.trust import ContractTrust
from corral.reconcile.devices.wiring import DeviceEvents
from corral.reconcile.doors import Doors, NotOwned
from corral.reconcile.guards.interlocks import Interlocks
from corral.reconcile.guards.leases import Leases
from corral.reconcile.guards.pauses import AgentPauses
from corral.reconcile.intents.execute import new_command_id
from corral.reconcile.intents.facts import name_of, status_of, uid_of, value_of
from corral.reconcile.intents.settings import IntentSettings
from corral.reconcile.intents.wiring import IntentController
from corral.reconcile.mqttside import MqttSide
from corral.reconcile.shardlabels import ShardLabels
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
# How long an acquired shard's devices are waited for (their retained info and status, sent again on subscribing)
# before its Intents are taken up: long against the broker's redelivery, short against a failover's budget.
HEARD_S = 3.0
# Shards acquired within this long of each other share one re-subscription.
REDELIVERY_BATCH_S = 0.2


class Controller:
    def __init__(self, config: ControllerConfig, intent_settings: IntentSettings, kube: Kube, recorder: EventRecorder,
                 signing_keys: Mapping[str, Ed25519PublicKey] | None = None, ownership: Ownership | None = None) -> None:
        self.config, self.kube = config, kube
        self.fleet, self.devices = Fleet(), DeviceCache()
        self.ownership = ownership if ownership is not None else _ownership(config.scale, kube)
        self.doors = Doors(self.ownership, self.devices, ShardLabels(kube, self.ownership.shards))
        self._leading = False
        self._redelivery: asyncio.Future[None] | None = None
        self._executing: dict[int, int] = {}  # executions in flight, by shard: a release waits for them
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
        self.device_reconciler.writer.doors = self.doors
        self.intents.outcomes.doors = self.doors
        self.server = _read_server(config, kube, self.access, port)
        self._workers: list[asyncio.Task[None]] = []
        self._watch()
        self.ownership.set_callbacks(self._acquired, self._releasing, self._lost)

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

    def on_intent_event(self, event_type: str, body: Body) -> None:
        self.intents.on_intent_event(event_type, body)

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
            await self._lead()
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

    def _run_workers(self) -> list[asyncio.Task[None]]:
        """Each queue and the reconciler that works it."""
        settings, intents = self.intents.settings, self.intents
        return [
            asyncio.create_task(run_workers(self.queue, self._reconcile_device, self.config.workers),
                                name="corral-devices"),
            asyncio.create_task(run_workers(intents.decisions, self._decide_intent, settings.decision_workers),
                                name="corral-intents"),
            asyncio.create_task(run_workers(intents.executions, self._execute_intents, settings.execution_workers),
                                name="corral-executions"),
        ]

    # ---- the gates: each queue's keys, for devices this replica owns ----------------------------------------

    async def _reconcile_device(self, device_id: str) -> Result:
        if not self.doors.takes(device_id):
            return Result.done()  # its owner reconciles it; queued again here if its shard is acquired
        try:
            return await self.device_reconciler.reconcile(device_id)
        except NotOwned:
            return Result.done()  # the shard was lost mid-way: the door refused, its new owner carries on

    async def _decide_intent(self, key: Key) -> Result:
        intent = self.intents.intents.get(key)
        # A malformed Intent names no readable Device: the leader answers it.
        device_id = self.doors.device_id(key[0], intent.spec.device) if intent is not None else None
        if not self.doors.takes(device_id):
            return Result.done()
        try:
            return await self.intents.reconciler.reconcile(key)
        except NotOwned:
            return Result.done()
        finally:
            self._unpin_ended(key, device_id)

    def _unpin_ended(self, key: Key, device_id: str | None) -> None:
        """An ended Intent holds no pin (one pinned at a takeover and then decided otherwise)."""
        intent = self.intents.intents.get(key)
        if self.doors.sharded and intent is not None and device_id is not None \
                and status_of(intent).phase in FINAL_PHASES:
            self.port.release_command(device_id, status_of(intent).command_id or new_command_id(uid_of(intent)))

    async def _execute_intents(self, device_key: Key) -> Result:
        device_id = self.doors.device_id(*device_key)
        if not self.doors.takes(device_id):
            # Not ours (any more): what was handed over here is decided again by the owner (requeued on acquire).
            self.intents.executor.handovers.ready.pop(device_key, None)
            return Result.done()
        shard = self.doors.shard(device_id) if device_id else 0
        self._executing[shard] = self._executing.get(shard, 0) + 1
        try:
            return await self.intents.executor.reconcile(device_key)
        except NotOwned:
            self.intents.executor.handovers.ready.pop(device_key, None)
            return Result.done()
        finally:
            self._executing[shard] -= 1

    # ---- what the Ownership tells ---------------------------------------------------------------------------

    async def _acquired(self, shard: int) -> None:
        """A shard is ours now: learn its devices as they are (retained info and status again), reconcile each,
        and take up its unfinished Intents (an Executing one resumes with its command id)."""
        # Until its devices are heard again, a Device event would find no runtime and write the device off as
        # waiting: its new work waits too (the gates), and everything is queued once they were heard.
        self.doors.waiting.add(shard)
        if shard == 0:
            await self._lead()
        await self._redelivered()
        await self._heard(shard)
        pinned = self._pin_inherited(shard)
        self.doors.waiting.discard(shard)
        for known in {*self.devices.device_ids(), *(rt.device_id for rt in self.fleet.values())}:
            if self.doors.shard(known) == shard:
                self.queue.add(known)
        resumed = 0
        for key, intent in self.intents.intents.items():
            if status_of(intent).phase in FINAL_PHASES:
                continue
            device_id = self.doors.device_id(key[0], intent.spec.device)
            if (self.doors.shard(device_id) if device_id else 0) == shard:
                self.intents.decisions.add(key)
                resumed += 1
        log.info("acquired shard %d: its devices queued, %d unfinished Intent(s) taken up (%d with their command "
                 "pinned)", shard, resumed, pinned)

    def _pin_inherited(self, shard: int) -> int:
        """As `IntentController.prime` at a restart, for a shard taken over: an Intent the previous owner may have
        been executing (any not ended nor awaiting approval: this replica cannot read the other's audit log) may have had its
        target applied and its command sent. Its command is pinned with the Intent's own id before the devices are
        reconciled, so the device reconciler leaves that actuator alone until the Intent, taken up, applies its
        target and sends that id, which the firmware answers from its memory if it ran already; otherwise the
        device reconciler could drive that target with an id of its own (seen in this replica's cache a moment
        later), and the hardware would act twice. Not the target as cached: the cache may lag. A pin the Intent
        never uses (decided otherwise) is released when it ends."""
        pinned = 0
        for key, intent in self.intents.intents.items():
            status, value = status_of(intent), value_of(intent)
            device_id = self.doors.device_id(key[0], intent.spec.device)
            # Not one that waits for a person: its pin would hold the actuator for as long.
            if status.phase in FINAL_PHASES or status.phase == "AwaitingApproval" or value is None or device_id is None \
                    or intent.spec.dry_run or self.doors.shard(device_id) != shard:
                continue
            self.port.pin(device_id, intent.spec.actuator, value, status.command_id or new_command_id(uid_of(intent)),
                          name_of(intent), None)
            pinned += 1
        return pinned

    async def _redelivered(self) -> None:
        """One re-subscription for the shards acquired together (a replica starting takes several at once): each
        makes the broker send every device's retained info and status again, which the owned devices' intake
        parses; one per shard would parse each contract as many times."""
        if self._redelivery is None or self._redelivery.done():
            self._redelivery = asyncio.ensure_future(self._redeliver_soon())
        await asyncio.shield(self._redelivery)

    async def _redeliver_soon(self) -> None:
        await asyncio.sleep(REDELIVERY_BATCH_S)
        self.mqtt.redeliver()

    async def _heard(self, shard: int) -> None:
        """Until the shard's enrolled devices were heard again (their retained contract and presence), for at most
        HEARD_S: a standby dropped their messages, and an Intent decided before would find its device unknown."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HEARD_S
        while loop.time() < deadline:
            missing = [d for d in self.devices.device_ids() if self.doors.shard(d) == shard
                       and ((rt := self.fleet.get(d)) is None or rt.contract is None)]
            if not missing:
                return
            await asyncio.sleep(0.1)
        log.info("shard %d: %d device(s) not heard within %g s of its acquisition (offline, or no contract yet)",
                 shard, len(missing), HEARD_S)

    async def _releasing(self, shard: int) -> None:
        """A shard is to be handed over: no new work for it, and its executions in flight end first (bounded by
        the command timeout; one still running then is resumed by the next owner with its command id)."""
        self.doors.waiting.add(shard)
        if shard == 0:
            await self._follow()
        deadline = asyncio.get_running_loop().time() + self.config.command_timeout_s
        while self._executing.get(shard, 0) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        log.info("releasing shard %d%s", shard,
                 "" if not self._executing.get(shard, 0) else " with executions still in flight (the next owner "
                 "resumes them)")

    async def _lost(self, shard: int) -> None:
        """Past the renew deadline: the doors refuse already; only the leader's own loops are stopped."""
        log.warning("lost shard %d: past the renew deadline, nothing more is sent or written for its devices", shard)
        if shard == 0:
            await self._follow()

    async def _lead(self) -> None:
        if self._leading:
            return
        self._leading = True
        self.capabilities.start()
        self.mqtt.lead()

    async def _follow(self) -> None:
        if not self._leading:
            return
        self._leading = False
        await self.capabilities.stop()
        await self.mqtt.follow()

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
        await self.mqtt.stop()
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


def _read_server(config: ControllerConfig, kube: Kube, access: AccessReviews, port: FleetPort) -> ReadServer | None:
    """The HTTPS server of audit records and readings, when a port is configured. It reads the devices through
    `port`, handed in here: serving/ imports nothing of reconcile/."""
    if not config.serve_port:
        return None
    cert, key_pem = config.serve_cert_file, config.serve_key_file
    if not cert or not key_pem:
        made = ensure_serving_certificate(Path(config.audit_key_file).parent)
        cert, key_pem = str(made.cert_file), str(made.key_file)
    return ReadServer(Reviews(kube.api, access), Path(config.audit_dir), config.serve_port, cert, key_pem,
                      host=config.serve_host, source=port, front_proxy=config.front_proxy)


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

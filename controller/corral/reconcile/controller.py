"""The device controller: discovery, the capability mirror, and driving each device to its target state.

Inputs arrive from two sides and only ever queue a device id: MQTT messages
(via `on_mqtt`) and Device watch events (via `on_device_event`). Workers take
ids off the queue and `reconcile()` one device at a time: bind or register
its Device, mirror its contract into a Capability, plan commands with the
pure `devices.plan`, send them and wait for acks, then write status only if
it changed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from corral.api.base import API_VERSION
from corral.api.capability import CapabilitySpec, capability_name
from corral.audit.events import EventRecorder, ObjectRef
from corral.contract.diff import contract_diff
from corral.contract.signature import verify
from corral.devices import messages
from corral.devices.commands import CommandTimeout, CommandTracker
from corral.devices.link import Inbound, MqttLink
from corral.devices.plan import Command, plan, same_value
from corral.devices.topics import Topics
from corral.obs import metrics, tracing
from corral.reconcile import conditions
from corral.reconcile.config import ControllerConfig
from corral.reconcile.fleet import DeviceCache, DeviceRuntime
from corral.reconcile.kube import Kube
from corral.reconcile.workqueue import WorkQueue

log = logging.getLogger(__name__)

RETAINED_GRACE_S = 3.0


class DeviceRefused(Exception):
    """The device answered a command with an error (its ack's `error`)."""


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_ms(epoch_ms: int) -> str:
    moment = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class DeviceController:
    def __init__(
        self,
        config: ControllerConfig,
        kube: Kube,
        recorder: EventRecorder,
        signing_keys: dict[str, Ed25519PublicKey] | None = None,
    ) -> None:
        self.config = config
        self.kube = kube
        self.recorder = recorder
        self.signing_keys = signing_keys or {}
        self.topics = Topics(config.topic_prefix)
        self.tracker = CommandTracker()
        self.fleet: dict[str, DeviceRuntime] = {}
        self.devices = DeviceCache()
        self.queue = WorkQueue()
        self.link = MqttLink(config.mqtt_url, self.topics, self.on_mqtt, on_connected=self._resync_all)
        self._workers: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._announced_duplicates: set[str] = set()
        self._link_up_since = 0.0
        # device id -> (actuator, wanted value, future): Intents waiting for the device to report a value.
        self._expectations: dict[str, list[tuple[str, Any, asyncio.Future[dict[str, Any]]]]] = {}
        # The trace of the Intent that wants (device, actuator) changed: its command joins that trace.
        self._command_traces: dict[tuple[str, str], Context] = {}

    # Lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        # Know every existing Device before the first retained `info` arrives; otherwise a device
        # that a person already bound under another name would be registered a second time.
        for body in await self.kube.list_devices(self.config.watch_namespaces):
            device_id = self.devices.upsert(body)
            if device_id:
                self.queue.add(device_id)
        await self.link.start()
        self._workers = [asyncio.create_task(self._work(), name=f"corral-worker-{i}") for i in range(self.config.workers)]

    async def stop(self) -> None:
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self.queue.close()
        await self.link.stop()

    async def _work(self) -> None:
        while True:
            device_id = await self.queue.get()
            try:
                await self.reconcile(device_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                # One device's failure must not stop the others; retry it later.
                log.exception("reconciling device %s failed; retrying", device_id)
                self.queue.add_after(device_id, self.config.backoff_max_s / 4)
            finally:
                self.queue.done(device_id)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # Inputs ------------------------------------------------------------------------------

    def on_device_event(self, event_type: str, body: dict[str, Any]) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if event_type == "DELETED":
            device_id = self.devices.remove(key)
            if device_id and device_id in self.fleet:
                rt = self.fleet[device_id]
                # Re-created only when the device announces itself again, not in a loop.
                rt.registration_suppressed = True
                rt.last_status = None
        else:
            device_id = self.devices.upsert(body)
        if device_id:
            self.queue.add(device_id)

    def on_mqtt(self, message: Inbound) -> None:
        parsed = self.topics.parse(message.topic)
        if parsed is None:
            return
        device_id, kind = parsed
        rt = self.fleet.get(device_id)
        if rt is None:
            if kind != "info":
                return  # devices become known through their contract
            rt = self.fleet[device_id] = DeviceRuntime(device_id)
            metrics.device_online_changed(None, rt.online, new=True)
        try:
            if kind == "info":
                self._on_info(rt, message.payload)
            elif kind == "status":
                self._on_status(rt, message.payload)
            elif kind == "ack":
                self._on_ack(rt, message.payload)
            elif kind == "telemetry":
                self._on_telemetry(rt, message.payload)
            elif kind == "event":
                self._on_event(rt, message.payload)
        except messages.BadMessage as err:
            log.warning("device %s sent a bad %s message: %s", device_id, kind, err)
            if kind == "info":
                self._refuse_contract(rt, str(err))

    def _touch(self, rt: DeviceRuntime) -> None:
        rt.last_seen = datetime.now(UTC)

    def _on_info(self, rt: DeviceRuntime, payload: bytes) -> None:
        contract = messages.parse_info(payload, rt.device_id)
        if self.config.require_signatures:
            check = verify(contract, self.signing_keys)
            if check.outcome != "valid":
                raise messages.BadMessage(f"contract signature {check.outcome}: {check.detail}")
        previous = rt.contract
        rt.contract, rt.contract_error = contract, None
        rt.capability = capability_name(contract)
        rt.capability_ensured = rt.capability_ensured and previous is not None and rt.capability == capability_name(previous)
        rt.registration_suppressed = False
        self._touch(rt)
        if previous is not None and capability_name(previous) != rt.capability:
            changes = contract_diff(previous, contract)
            self._event_later(rt, "ContractChanged", "Observe", "The device announced a changed contract: " + "; ".join(changes))
        self.queue.add(rt.device_id)

    def _refuse_contract(self, rt: DeviceRuntime, why: str) -> None:
        rt.contract, rt.contract_error = None, why
        rt.announced.discard("contract-refused")
        self.queue.add(rt.device_id)

    def _on_status(self, rt: DeviceRuntime, payload: bytes) -> None:
        online = messages.parse_status(payload)
        if online != rt.online:
            metrics.device_online_changed(rt.online, online)
            rt.online = online
            rt.state_known = False  # a device that was away may have restarted with other state
            rt.failures, rt.next_attempt = 0, 0.0
        self._touch(rt)
        self.queue.add(rt.device_id)

    def _on_ack(self, rt: DeviceRuntime, payload: bytes) -> None:
        ack = messages.parse_ack(payload)
        self._touch(rt)
        self.tracker.resolve(rt.device_id, ack)

    def _on_telemetry(self, rt: DeviceRuntime, payload: bytes) -> None:
        telemetry = messages.parse_telemetry(payload)
        self._touch(rt)
        for sample in telemetry.samples:
            rt.buffer.add(sample)
        current = {metric: sample.value for metric, sample in rt.buffer.latest.items()}
        sensors = {s.metric: s for s in rt.contract.sensors} if rt.contract else {}
        now = time.monotonic()
        rule = self.config.coalescing
        if rule.should_write(rt.sensors_written, current, now - rt.sensors_written_at, sensors,
                             rt.early_writes.available(rule, now)):
            self.queue.add(rt.device_id)

    def _on_event(self, rt: DeviceRuntime, payload: bytes) -> None:
        event = messages.parse_event(payload)
        self._touch(rt)
        if event.state is not None:
            # The device reports its whole state after a local change or a restart.
            self._apply_reported(rt, dict(event.state), cause=f"the device reported its state ({event.event})")
            self.queue.add(rt.device_id)

    def _resync_all(self) -> None:
        """After (re)connecting: states may have changed while we could not hear them."""
        self._link_up_since = time.monotonic()
        for rt in self.fleet.values():
            rt.state_known = False
            self.queue.add(rt.device_id)

    # Reconcile ---------------------------------------------------------------------------

    async def reconcile(self, device_id: str) -> None:
        rt = self.fleet.get(device_id)
        bound = self.devices.bound(device_id)
        log.debug("reconcile %s: known=%s bound=%d", device_id, rt is not None, len(bound))
        if not bound:
            # A refused device is registered too: a person should see that it is there and why it is inert.
            announced = rt is not None and (rt.contract is not None or rt.contract_error is not None)
            if announced and self.config.auto_register and not rt.registration_suppressed:  # type: ignore[union-attr]
                await self._register(rt)  # type: ignore[arg-type]
            return
        body = bound[0]
        for duplicate in bound[1:]:
            await self._refuse_duplicate(duplicate, body)
        if rt is None:
            # Retained `info` messages arrive right after subscribing; judge a device unheard of only after that.
            if not self.link.connected.is_set():
                self.queue.add_after(device_id, RETAINED_GRACE_S)
                return
            wait = RETAINED_GRACE_S - (time.monotonic() - self._link_up_since)
            if wait > 0:
                self.queue.add_after(device_id, wait)
                return
            await self._write_status(None, body, self._status_waiting(body), "waiting")
            return
        if rt.contract is None:
            if rt.contract_error is not None:
                await self._announce_once(rt, body, "contract-refused", "ContractRefused", "Refuse",
                                          f"The device's contract was refused: {rt.contract_error}", "Warning")
            await self._write_status(rt, body, self._status_from(rt, body, plan_result=None), "contract")
            return
        await self._ensure_capability(rt)
        if not rt.reported and not rt.state_known:
            # After a restart, what status recorded is the baseline that changes are audited against.
            rt.reported = dict((body.get("status") or {}).get("reported") or {})
        if rt.online and not rt.state_known and self.link.connected.is_set():
            await self._sync_state(rt, body)

        spec = body.get("spec", {})
        generation = body["metadata"].get("generation", 1)
        uid = body["metadata"]["uid"]
        epoch = self._epoch(rt, body)
        reached = rt.reached_set((uid, generation, epoch))
        result = plan(
            rt.contract, spec.get("target") or {}, rt.reported, uid=uid, generation=generation, epoch=epoch,
            drift=spec.get("drift", "Enforce"), reached=frozenset(reached),
        )
        for actuator, why in result.invalid.items():
            await self._announce_once(rt, body, f"invalid/{generation}/{actuator}", "TargetInvalid", "Refuse",
                                      f"Not sent to the device: {why}", "Warning")
        if result.drifted:
            await self._announce_once(
                rt, body, f"drift/{generation}/{epoch}/{','.join(result.drifted)}", "Drift", "Observe",
                f"The device left its target for {', '.join(result.drifted)} (reported "
                f"{_json({a: rt.reported.get(a) for a in result.drifted})}); "
                + ("re-driving it." if result.bump_epoch else "drift: Observe, leaving it alone."),
                "Warning",
            )
        if result.bump_epoch:
            # The new epoch must be on record before a command carries it (see devices.plan).
            rt.command_epoch = epoch + 1
            await self._write_status(rt, body, self._status_from(rt, body, plan_result=result), "epoch", force=True)
            self.queue.add(device_id)
            return
        if result.commands:
            if not rt.online:
                pass  # sent when the device is back online (its status message queues it)
            elif time.monotonic() < rt.next_attempt:
                self.queue.add_after(device_id, rt.next_attempt - time.monotonic())
            else:
                await self._drive(rt, body, result.commands, reached)
                result = plan(
                    rt.contract, spec.get("target") or {}, rt.reported, uid=uid, generation=generation,
                    epoch=epoch, drift=spec.get("drift", "Enforce"), reached=frozenset(reached),
                )
        await self._write_status(rt, body, self._status_from(rt, body, plan_result=result), "reconcile")

    async def _drive(self, rt: DeviceRuntime, body: dict[str, Any], commands: list[Command], reached: set[str]) -> None:
        cause = self._cause(body)
        for command in commands:
            before = dict(rt.reported)
            await self._event(body, "CommandSent", "Command",
                              f"{command.action} {command.actuator}={_json(command.value)} (command {command.id}; "
                              f"cause: {cause}); before: {_json(before)}")
            trace = self._command_traces.pop((rt.device_id, command.actuator), None)
            try:
                with tracing.tracer().start_as_current_span(
                        "corral.device.command", context=trace, kind=SpanKind.PRODUCER,
                        attributes={"corral.device_id": rt.device_id, "corral.command": command.id,
                                    "messaging.system": "mqtt"}):
                    ack = await self.tracker.send(
                        rt.device_id,
                        lambda payload: self.link.publish(self.topics.of(rt.device_id, "cmd"), payload,
                                                          trace=tracing.carrier()),
                        command.payload(),
                        self.config.command_timeout_s,
                    )
            except CommandTimeout as err:
                self._backoff(rt)
                await self._event(body, "CommandTimeout", "Command",
                                  f"{err}; will resend the same command id in {rt.next_attempt - time.monotonic():.0f}s",
                                  "Warning")
                return
            if not ack.ok:
                self._settle(rt.device_id, refused=(command.actuator, ack.error or "refused without a reason"))
                self._backoff(rt)
                await self._event(body, "CommandFailed", "Command",
                                  f"The device refused command {command.id}: {ack.error}", "Warning")
                if ack.state:
                    self._apply_reported(rt, dict(ack.state), cause=f"command {command.id}", body=body)
                return
            rt.failures, rt.next_attempt = 0, 0.0
            self._apply_reported(rt, dict(ack.state), cause=f"command {command.id} ({cause})", body=body)
            if ack.clamped is not None:
                await self._event(body, "ValueClamped", "Command",
                                  f"The device clamped {ack.clamped.actuator}: requested {ack.clamped.requested!r}, "
                                  f"applied {ack.clamped.applied!r} (command {command.id})", "Warning")
            reached.add(command.actuator)

    async def _sync_state(self, rt: DeviceRuntime, body: dict[str, Any]) -> None:
        try:
            state = await self._get_state(rt.device_id)
        except CommandTimeout:
            self.queue.add_after(rt.device_id, self.config.backoff_min_s * 2)
            return
        self._apply_reported(rt, state, cause="state read after the device came online", body=body)

    async def _get_state(self, device_id: str) -> dict[str, Any]:
        """Ask the device for its full state now (get_state changes nothing); CommandTimeout if it does not answer."""
        command = {"id": f"get-{uuid.uuid4().hex[:16]}", "cmd": "get_state", "params": {}}
        ack = await self.tracker.send(
            device_id, lambda payload: self.link.publish(self.topics.of(device_id, "cmd"), payload),
            command, self.config.command_timeout_s,
        )
        return dict(ack.state)

    # Expectations (for Intents) ---------------------------------------------------------

    def expect(self, device_id: str, actuator: str, value: Any, trace: Context | None = None
               ) -> asyncio.Future[dict[str, Any]]:
        """A future for the device's full state once it reports `actuator == value`.

        It fails with DeviceRefused when the device refuses a command for that actuator. `trace`: the
        context the command that gets it there is traced in.
        """
        if trace is not None:
            self._command_traces[(device_id, actuator)] = trace
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        rt = self.fleet.get(device_id)
        if rt is not None and rt.state_known and same_value(rt.reported.get(actuator), value):
            future.set_result(dict(rt.reported))
        else:
            self._expectations.setdefault(device_id, []).append((actuator, value, future))
        return future

    def _settle(self, device_id: str, state: dict[str, Any] | None = None, refused: tuple[str, str] | None = None) -> None:
        waiting = self._expectations.get(device_id, [])
        still = []
        for actuator, value, future in waiting:
            if future.done():
                continue
            if state is not None and same_value(state.get(actuator), value):
                future.set_result(dict(state))
            elif refused is not None and refused[0] == actuator:
                future.set_exception(DeviceRefused(refused[1]))
            else:
                still.append((actuator, value, future))
        if still:
            self._expectations[device_id] = still
        else:
            self._expectations.pop(device_id, None)

    def still_listening(self) -> bool:
        """True right after (re)connecting, while retained messages may still tell of devices."""
        return not self.link.connected.is_set() or time.monotonic() - self._link_up_since < RETAINED_GRACE_S

    async def read_state(self, device_id: str) -> dict[str, Any]:
        """The device's full state, asked from the device now (get_state); TimeoutError if it does not answer."""
        try:
            state = await self._get_state(device_id)
        except CommandTimeout as err:
            raise TimeoutError(str(err)) from None
        rt = self.fleet.get(device_id)
        if rt is not None:
            self._apply_reported(rt, state, cause="read by an Intent")
        return state

    def device_for(self, namespace: str, name: str) -> tuple[dict[str, Any] | None, DeviceRuntime | None]:
        """The Device object and what the controller knows of its device, if it is the bound one."""
        body = self.devices.get((namespace, name))
        if body is None:
            return None, None
        device_id = (body.get("spec") or {}).get("deviceId")
        bound = self.devices.bound(device_id) if device_id else []
        if not bound or bound[0] is not body:
            return body, None
        return body, self.fleet.get(device_id)

    def _apply_reported(self, rt: DeviceRuntime, state: dict[str, Any], cause: str, body: dict[str, Any] | None = None) -> None:
        rt.state_known = True
        self._settle(rt.device_id, state=state)
        if state == rt.reported:
            return
        before, rt.reported = rt.reported, state
        changed = {k: v for k, v in state.items() if before.get(k) != v}
        log.info("device %s reported %s (before %s); cause: %s", rt.device_id, changed,
                 {k: before.get(k) for k in changed}, cause)
        target = body or next(iter(self.devices.bound(rt.device_id)), None)
        if target is not None and before:
            self._spawn(self._event(target, "StateChanged", "Report",
                                    f"Reported state changed: {_json(changed)} "
                                    f"(before: {_json({k: before.get(k) for k in changed})}); cause: {cause}"))

    def _backoff(self, rt: DeviceRuntime) -> None:
        delay = min(self.config.backoff_max_s, self.config.backoff_min_s * 2 ** rt.failures)
        rt.failures += 1
        rt.next_attempt = time.monotonic() + delay
        self.queue.add_after(rt.device_id, delay)

    def _cause(self, body: dict[str, Any]) -> str:
        annotations = body["metadata"].get("annotations") or {}
        intent = annotations.get("corral.dev/intent")
        generation = body["metadata"].get("generation")
        return f"intent {intent}" if intent else f"spec change (generation {generation})"

    # Kubernetes side ---------------------------------------------------------------------

    async def _register(self, rt: DeviceRuntime) -> None:
        labels = {"corral.dev/registered-by": "controller"}
        if rt.contract is not None:
            labels["corral.dev/model"] = _label(rt.contract.model)
            what = f"{rt.contract.name}, {rt.contract.model} {rt.contract.fw}"
        else:
            what = "its contract was refused, so it stays inert"
        body = {
            "apiVersion": API_VERSION,
            "kind": "Device",
            "metadata": {"name": rt.device_id, "labels": labels},
            "spec": {"deviceId": rt.device_id},
        }
        created = await self.kube.create_device(self.config.namespace, body)
        if created is not None:
            self.on_device_event("ADDED", created)
            await self._event(created, "Registered", "Register",
                              f"Registered device {rt.device_id} announced over MQTT ({what})")

    async def _ensure_capability(self, rt: DeviceRuntime) -> None:
        if rt.capability_ensured or rt.contract is None or rt.capability is None:
            return
        spec = CapabilitySpec.from_contract(rt.contract).model_dump(mode="json", exclude_none=True)
        body = {"apiVersion": API_VERSION, "kind": "Capability", "metadata": {"name": rt.capability}, "spec": spec}
        if await self.kube.create_capability(body):
            await self.recorder.post(
                ObjectRef(API_VERSION, "Capability", rt.capability, None, None), "Created", "Register",
                f"Contract of {rt.contract.model} {rt.contract.fw} first announced by {rt.device_id}",
            )
        rt.capability_ensured = True

    async def _refuse_duplicate(self, body: dict[str, Any], winner: dict[str, Any]) -> None:
        owner = f"{winner['metadata']['namespace']}/{winner['metadata']['name']}"
        message = (f"device {body['spec']['deviceId']} is already bound to Device {owner} (the oldest claim wins); "
                   "this Device stays inert until that one is deleted or its deviceId changes")
        generation = body["metadata"].get("generation")
        status = {
            "observedGeneration": generation,
            "conditions": [
                conditions.condition("Bound", "False", "DuplicateDeviceId", message, generation),
                conditions.condition("Ready", "False", "DuplicateDeviceId", message, generation),
            ],
        }
        await self._write_status(None, body, status, "duplicate")
        key = f"duplicate/{body['metadata'].get('uid')}"
        if key not in self._announced_duplicates:
            self._announced_duplicates.add(key)
            await self._event(body, "DuplicateDeviceId", "Refuse", message, "Warning")

    def _status_waiting(self, body: dict[str, Any]) -> dict[str, Any]:
        """Not heard of since the controller started: keep what is known, marked stale."""
        generation = body["metadata"].get("generation")
        previous = body.get("status") or {}
        kept = {k: previous[k] for k in ("capability", "reported", "sensors", "lastSeen", "commandEpoch") if k in previous}
        wanted = [
            conditions.condition("ContractValid", "Unknown", "WaitingForDevice",
                                 "No contract yet: the device has not announced itself on MQTT.", generation),
            conditions.condition("Ready", "False", "WaitingForDevice", "The device has not announced itself.", generation),
        ]
        return {**kept, "observedGeneration": generation, "online": False, "stale": True, "inSync": False,
                "conditions": wanted}

    def _epoch(self, rt: DeviceRuntime, body: dict[str, Any]) -> int:
        """The re-drive epoch in effect: ours if we just raised it, else what status records."""
        recorded = int((body.get("status") or {}).get("commandEpoch") or 0)
        rt.command_epoch = max(rt.command_epoch, recorded)
        return rt.command_epoch

    def _status_from(self, rt: DeviceRuntime, body: dict[str, Any], plan_result: Any) -> dict[str, Any]:
        generation = body["metadata"].get("generation")
        previous = rt.last_status or body.get("status") or {}
        status: dict[str, Any] = {"observedGeneration": generation}
        epoch = self._epoch(rt, body)
        if epoch:
            status["commandEpoch"] = epoch
        status["online"] = bool(rt.online)
        status["stale"] = not rt.online
        if rt.capability and rt.contract is not None:
            status["capability"] = rt.capability
        if rt.reported:
            status["reported"] = dict(rt.reported)
        sensors = self._sensors_for_status(rt, previous)
        if sensors:
            status["sensors"] = sensors
        wanted: list[dict[str, Any]] = []
        if rt.contract is None:
            reason, message = "Refused", rt.contract_error or "no contract"
            wanted.append(conditions.condition("ContractValid", "False", reason, message, generation))
            status["inSync"] = False
            wanted.append(conditions.condition("Ready", "False", "ContractInvalid", "The device is inert: " + message, generation))
        else:
            wanted.append(conditions.condition("ContractValid", "True", "Accepted", f"Capability {rt.capability}", generation))
            in_sync, reason, message = self._sync_verdict(rt, plan_result)
            status["inSync"] = in_sync
            wanted.append(conditions.condition("InSync", "True" if in_sync else "False", reason, message, generation))
            online = bool(rt.online)
            wanted.append(conditions.condition(
                "Ready", "True" if online and in_sync else "False",
                "Ready" if online and in_sync else ("Offline" if not online else reason),
                "Online and at its target." if online and in_sync else message if online else "The device is offline; "
                "reported state and sensors are its last known values.", generation,
            ))
        status["conditions"] = wanted
        return status

    def _sync_verdict(self, rt: DeviceRuntime, result: Any) -> tuple[bool, str, str]:
        if result is None:
            return False, "Unknown", "Not planned yet."
        if result.invalid:
            return False, "InvalidTarget", "; ".join(f"{a}: {why}" for a, why in sorted(result.invalid.items()))
        if result.drifted:
            return False, "Drifted", f"{', '.join(result.drifted)} changed on the device; drift policy Observe leaves it."
        if result.commands:
            pending = ", ".join(f"{c.actuator}={c.value!r}" for c in result.commands)
            if not rt.online:
                return False, "DeviceOffline", f"Waiting for the device to come online to apply {pending}."
            if rt.failures:
                return False, "Retrying", f"Applying {pending} (attempt {rt.failures + 1})."
            return False, "Pending", f"Applying {pending}."
        return True, "InSync", "Reported state matches the target."

    def _sensors_for_status(self, rt: DeviceRuntime, previous: dict[str, Any]) -> dict[str, Any]:
        units = {s.metric: s.unit for s in rt.contract.sensors} if rt.contract else {}
        latest = rt.buffer.latest
        current = {metric: sample.value for metric, sample in latest.items()}
        now, rule = time.monotonic(), self.config.coalescing
        due = rule.should_write(
            rt.sensors_written, current, now - rt.sensors_written_at,
            {s.metric: s for s in rt.contract.sensors} if rt.contract else {}, rt.early_writes.available(rule, now),
        )
        if not due:
            return previous.get("sensors") or {}
        return {
            metric: {"value": sample.value, "unit": units.get(metric, ""), "timestamp": rfc3339_ms(sample.ts)}
            for metric, sample in sorted(latest.items())
        }

    async def _write_status(
        self, rt: DeviceRuntime | None, body: dict[str, Any], status: dict[str, Any], reason: str, force: bool = False
    ) -> None:
        now = time.monotonic()
        previous = (rt.last_status if rt is not None else None) or body.get("status") or {}
        status["conditions"] = conditions.merge(previous.get("conditions") or [], status["conditions"], rfc3339(datetime.now(UTC)))
        if rt is not None and rt.last_seen is not None:
            last_seen = rfc3339(rt.last_seen)
            refresh = now - rt.last_seen_written_at >= self.config.last_seen_interval_s
            status["lastSeen"] = last_seen if refresh or not previous.get("lastSeen") else previous["lastSeen"]
        comparable = {k: v for k, v in status.items() if k != "lastSeen"}
        unchanged = comparable == {k: v for k, v in previous.items() if k != "lastSeen"}
        if unchanged and status.get("lastSeen") == previous.get("lastSeen") and not force:
            return
        if unchanged and not force:
            reason = "last-seen"
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        log.debug("status write %s/%s (%s)", namespace, name, reason)
        await self.kube.apply_device_status(namespace, name, status, reason)
        if rt is not None:
            rt.last_status = status
            if status.get("lastSeen") != previous.get("lastSeen"):
                rt.last_seen_written_at = now
            if status.get("sensors") != previous.get("sensors"):
                rt.early_writes.spend(self.config.coalescing, now)
                rt.sensors_written = {m: s["value"] for m, s in (status.get("sensors") or {}).items()}
                rt.sensors_written_at = now

    # Events ------------------------------------------------------------------------------

    async def _event(self, body: dict[str, Any], reason: str, action: str, note: str, type_: Any = "Normal") -> None:
        meta = body["metadata"]
        ref = ObjectRef(API_VERSION, "Device", meta["name"], meta.get("namespace"), meta.get("uid"))
        await self.recorder.post(ref, reason, action, note, type_)

    async def _announce_once(self, rt: DeviceRuntime, body: dict[str, Any], key: str, reason: str, action: str,
                             note: str, type_: Any = "Normal") -> None:
        if key in rt.announced:
            return
        rt.announced.add(key)
        await self._event(body, reason, action, note, type_)

    def _event_later(self, rt: DeviceRuntime, reason: str, action: str, note: str) -> None:
        bound = self.devices.bound(rt.device_id)
        if bound:
            self._spawn(self._event(bound[0], reason, action, note))


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _label(text: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in text)[:63].strip("-_.")
    return cleaned or "unknown"

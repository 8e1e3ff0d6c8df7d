"""The Intent pipeline: gather the facts, let `decide` judge, execute through the Device's target, audit.

An Intent moves Pending -> (AwaitingApproval ->) Executing -> Succeeded, or ends
Denied/Failed with one code. Its phase is written before each step that has
an effect, so a controller restarted at any point resumes instead of deciding
twice: an Intent found Executing is carried on, never re-decided.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from opentelemetry import context as otel_context

from corral.api.base import API_VERSION
from corral.audit.events import EventRecorder, ObjectRef
from corral.contract.values import check
from corral.decide.approvals import ApprovalView
from corral.decide.decision import Decision, DeviceFacts, IntentFacts, Observation, Policy, decide
from corral.decide.idempotency import params_hash
from corral.obs import metrics, tracing
from corral.reconcile.controller import DeviceController, DeviceRefused, rfc3339
from corral.reconcile.kube import INTENTS_FIELD_MANAGER, FieldConflict, Kube
from corral.reconcile.workqueue import WorkQueue

log = logging.getLogger(__name__)

FINAL_PHASES = {"Succeeded", "Denied", "Failed"}
_PHASE_OF = {"EXECUTED": "Succeeded", "DEVICE_GONE": "Failed", "TIMEOUT": "Failed", "FAILED": "Failed"}


@dataclass(frozen=True)
class IntentSettings:
    policy: Policy = Policy()
    execution_timeout_s: float = 10.0
    ttl: timedelta = timedelta(hours=24)
    workers: int = 8


class IntentController:
    def __init__(self, settings: IntentSettings, kube: Kube, recorder: EventRecorder, devices: DeviceController) -> None:
        self.settings = settings
        self.kube = kube
        self.recorder = recorder
        self.devices = devices
        self.intents: dict[tuple[str, str], dict[str, Any]] = {}
        self.approvals: dict[tuple[str, str], dict[str, Any]] = {}
        self._awaiting: set[tuple[str, str]] = set()  # for the approvals-waiting gauge
        # Intents this process gave a final code, by key -> uid. The watch may still deliver an older
        # copy (phase Executing) after the final write; it must not be finished a second time.
        self._finished: dict[tuple[str, str], str] = {}
        self.queue = WorkQueue()
        self._workers: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._workers = [asyncio.create_task(self._work(), name=f"corral-intents-{i}") for i in range(self.settings.workers)]

    async def stop(self) -> None:
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self.queue.close()

    # Inputs ------------------------------------------------------------------------------

    def on_intent_event(self, event_type: str, body: dict[str, Any]) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if event_type == "DELETED":
            self.intents.pop(key, None)
            self._awaiting.discard(key)
            self._finished.pop(key, None)
        else:
            self.intents[key] = body
            if (body.get("status") or {}).get("phase") == "AwaitingApproval":
                self._awaiting.add(key)
            else:
                self._awaiting.discard(key)
            self.queue.add(_key(key))
        metrics.APPROVALS_WAITING.set(len(self._awaiting))

    def on_approval_event(self, event_type: str, body: dict[str, Any]) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if event_type == "DELETED":
            self.approvals.pop(key, None)
            return
        self.approvals[key] = body
        intent_name = ((body.get("spec") or {}).get("intent") or {}).get("name")
        if intent_name:
            self.queue.add(_key((key[0], intent_name)))

    async def _work(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self.reconcile(_unkey(key))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("handling Intent %s failed; retrying", key)
                self.queue.add_after(key, 5)
            finally:
                self.queue.done(key)

    # Reconcile ---------------------------------------------------------------------------

    async def reconcile(self, key: tuple[str, str]) -> None:
        body = self.intents.get(key)
        if body is None:
            return
        # Joins the trace of whoever created the Intent (the gateway's tool call), if it carries one.
        with tracing.tracer().start_as_current_span(
                "corral.intent.reconcile", context=tracing.context_of(body),
                attributes={"corral.intent": f"{key[0]}/{key[1]}"}) as span:
            await self._reconcile(key, body)
            span.set_attribute("corral.phase", str((body.get("status") or {}).get("phase")))

    async def _reconcile(self, key: tuple[str, str], body: dict[str, Any]) -> None:
        status = body.get("status") or {}
        phase = status.get("phase")
        if self._finished.get(key) == body["metadata"]["uid"] and phase not in FINAL_PHASES:
            return  # a stale copy from before our final write; its own watch event follows
        if phase in FINAL_PHASES:
            await self._housekeep(body)
            return
        if phase == "Executing":
            await self._execute(body, resumed=True)
            return
        facts, device_facts, device_body = self._facts(body)
        if device_body is not None and not device_facts.exists and self.devices.still_listening():
            # Just (re)started: the device may announce itself in a moment; do not call it gone yet.
            self.queue.add_after(_key(key), 1.0)
            return
        spec = body["spec"]
        namespace = key[0]
        digest = params_hash(namespace, spec)
        requester_may = False
        actuator = device_facts.contract.actuator(facts.actuator) if device_facts.contract else None
        level = "read" if facts.action == "read" else (actuator.level if actuator is not None else None)
        if level is not None and device_facts.contract is not None:
            requester_may = await self.kube.may(facts.requester, level, namespace, facts.device)
        approvals = await self._approvals_for(body, facts.device)
        now = datetime.now(UTC)
        decision = decide(facts, device_facts, requester_may, approvals, digest, now, self.settings.policy)

        base = {"paramsHash": digest, "risk": decision.risk, "level": decision.level}
        if decision.outcome == "final":
            await self._finish(body, device_body, decision.code, decision.message, base)  # type: ignore[arg-type]
        elif decision.outcome == "await_approval":
            waiting = {**base, "phase": "AwaitingApproval", "message": decision.message,
                       "approvalExpiresAt": rfc3339(decision.expires_at)} if decision.expires_at else {}
            if status.get("phase") != "AwaitingApproval":
                await self._write(body, waiting, "awaiting-approval")
                await self._event(body, "AwaitingApproval", "Decide", decision.message)
            if decision.expires_at is not None:
                self.queue.add_after(_key(key), max(0.1, (decision.expires_at - now).total_seconds() + 0.1))
        elif facts.action == "read":
            await self._read(body, device_body, base)
        else:
            await self._begin_execution(body, device_body, decision, base)

    def _facts(self, body: dict[str, Any]) -> tuple[IntentFacts, DeviceFacts, dict[str, Any] | None]:
        meta, spec = body["metadata"], body["spec"]
        created = datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00"))
        facts = IntentFacts(
            uid=meta["uid"],
            name=meta["name"],
            device=spec["device"],
            actuator=spec["actuator"],
            action=spec["action"],
            value=(spec.get("params") or {}).get("value"),  # none for a read
            requester=spec["requester"],
            created_at=created,
            based_on=tuple(Observation(o["metric"], o["ts"], o.get("deviceId")) for o in spec.get("basedOn") or []),
        )
        device_body, rt = self.devices.device_for(meta["namespace"], spec["device"])
        device_id = (device_body or {}).get("spec", {}).get("deviceId")
        device_facts = DeviceFacts(
            exists=device_body is not None and rt is not None,
            device_id=device_id,
            contract=rt.contract if rt is not None else None,
            online=rt.online if rt is not None else None,
        )
        return facts, device_facts, device_body

    async def _approvals_for(self, intent: dict[str, Any], device: str) -> list[ApprovalView]:
        namespace, name = intent["metadata"]["namespace"], intent["metadata"]["name"]
        views = []
        for (ns, _), approval in sorted(self.approvals.items()):
            spec = approval.get("spec") or {}
            if ns != namespace or (spec.get("intent") or {}).get("name") != name:
                continue
            meta, status = approval["metadata"], approval.get("status") or {}
            expires = spec.get("expiresAt")
            views.append(ApprovalView(
                name=meta["name"],
                intent_uid=spec["intent"]["uid"],
                params_hash=spec["paramsHash"],
                decision=spec["decision"],
                approver=spec["approver"],
                approver_may_approve=await self.kube.may(spec["approver"], "approve", namespace, device),
                created_at=_parse_time(meta["creationTimestamp"]),
                expires_at=_parse_time(expires) if expires else None,
                consumed=bool(status.get("consumed")),
                reason=spec.get("reason") or "",
            ))
        return views

    # Execution ---------------------------------------------------------------------------

    async def _begin_execution(self, body: dict[str, Any], device_body: dict[str, Any] | None, decision: Decision,
                               base: dict[str, Any]) -> None:
        assert device_body is not None
        _, rt = self.devices.device_for(body["metadata"]["namespace"], body["spec"]["device"])
        before = dict(rt.reported) if rt is not None else {}
        # On record first: from here on a restart resumes this execution instead of deciding again.
        executing = {**base, "phase": "Executing", "message": decision.message, "before": before,
                     "approval": ",".join(decision.approvals) or None}
        await self._write(body, {k: v for k, v in executing.items() if v is not None}, "executing")
        body["status"] = {**(body.get("status") or {}), **executing}
        for name in decision.approvals:
            await self.kube.apply_status("approvals", body["metadata"]["namespace"], name, "Approval", {
                "consumed": True, "consumedAt": rfc3339(datetime.now(UTC)),
                "message": f"Used by Intent {body['metadata']['name']}",
            }, "approval-consumed")
        await self._execute(body, resumed=False)

    async def _read(self, body: dict[str, Any], device_body: dict[str, Any] | None, base: dict[str, Any]) -> None:
        """Answer from the device itself: its state now, and its latest sensor readings."""
        spec = body["spec"]
        _, rt = self.devices.device_for(body["metadata"]["namespace"], spec["device"])
        assert rt is not None
        try:
            state = await self.devices.read_state(rt.device_id)
        except TimeoutError:
            await self._finish(body, device_body, "TIMEOUT",
                               f"The device did not answer the read within {self.devices.config.command_timeout_s:g} s.",
                               base)
            return
        readings = {metric: sample.value for metric, sample in rt.buffer.latest.items()}
        item = spec["actuator"]
        if item in state:
            found = f"{item}={state[item]!r}, read from the device just now"
        else:
            sample = rt.buffer.latest.get(item)
            age = (datetime.now(UTC).timestamp() * 1000 - sample.ts) / 1000 if sample else None
            found = f"{item}={sample.value!r}, measured {age:.1f} s ago" if sample else f"{item}: no reading yet"
        await self._finish(body, device_body, "EXECUTED", f"Read {found}.",
                           {**base, "after": {**readings, **state}})

    async def _execute(self, body: dict[str, Any], resumed: bool) -> None:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        spec, status = body["spec"], body.get("status") or {}
        device_body, rt = self.devices.device_for(namespace, spec["device"])
        if device_body is None or rt is None or rt.contract is None:
            await self._finish(body, device_body, "DEVICE_GONE", f"Device {spec['device']} disappeared before execution.", {})
            return
        actuator = rt.contract.actuator(spec["actuator"])
        assert actuator is not None
        value = check(actuator, spec["params"]["value"])  # checked by decide(); this gives its canonical type
        target = {**_owned_target(device_body, INTENTS_FIELD_MANAGER), spec["actuator"]: value}
        reached = self.devices.expect(rt.device_id, spec["actuator"], value, trace=otel_context.get_current())
        try:
            await self.kube.apply_intent_target(namespace, spec["device"], target, name)
        except FieldConflict as conflict:
            reached.cancel()
            await self._finish(body, device_body, "FAILED",
                               f"Not applied: spec.target.{spec['actuator']} of Device {spec['device']} is managed by "
                               f"someone else ({conflict}). Corral does not overwrite a person's settings; remove the "
                               f"field from their manifest (or apply theirs with the new value).", {})
            return
        try:
            after = await asyncio.wait_for(reached, self.settings.execution_timeout_s)
        except TimeoutError:
            await self._finish(body, device_body, "TIMEOUT",
                               f"The device did not report {spec['actuator']}={value!r} within "
                               f"{self.settings.execution_timeout_s:g} s. The target stays set; the controller keeps "
                               f"driving the device there.", {})
            return
        except DeviceRefused as refusal:
            await self._finish(body, device_body, "FAILED", f"The device refused: {refusal}.", {})
            return
        before = status.get("before") or {}
        await self._finish(body, device_body, "EXECUTED",
                           f"{spec['action']} {spec['actuator']}={value!r} done; the device reports it"
                           + (" (resumed after a restart)." if resumed else "."),
                           {"before": before, "after": after})

    async def _finish(self, body: dict[str, Any], device_body: dict[str, Any] | None, code: str, message: str,
                      extra: dict[str, Any]) -> None:
        phase = _PHASE_OF.get(code, "Denied")
        status = {**{k: v for k, v in extra.items() if v is not None}, "phase": phase, "code": code,
                  "message": message[:1024], "decidedAt": rfc3339(datetime.now(UTC))}
        await self._write(body, status, "final")
        body["status"] = {**(body.get("status") or {}), **status}
        self._finished[(body["metadata"]["namespace"], body["metadata"]["name"])] = body["metadata"]["uid"]
        metrics.INTENTS.labels(code=code).inc()
        created = _parse_time(body["metadata"]["creationTimestamp"])
        metrics.INTENT_SECONDS.observe(max(0.0, (datetime.now(UTC) - created).total_seconds()))
        kind = "Normal" if code == "EXECUTED" else "Warning"
        note = f"{code}: {message} (requested by {body['spec']['requester']})"
        await self._event(body, code.title().replace("_", ""), "Decide", note, kind)
        if device_body is not None:
            meta = device_body["metadata"]
            await self.recorder.post(
                ObjectRef(API_VERSION, "Device", meta["name"], meta["namespace"], meta.get("uid")),
                "Intent" + code.title().replace("_", ""), "Decide",
                f"Intent {body['metadata']['name']}: {note}", kind,
            )
        self.queue.add_after(_key((body["metadata"]["namespace"], body["metadata"]["name"])),
                             self.settings.ttl.total_seconds())

    async def _housekeep(self, body: dict[str, Any]) -> None:
        decided = (body.get("status") or {}).get("decidedAt")
        if not decided:
            return
        age = datetime.now(UTC) - _parse_time(decided)
        if age >= self.settings.ttl:
            await self.kube.delete_intent(body["metadata"]["namespace"], body["metadata"]["name"], body["metadata"]["uid"])
        else:
            self.queue.add_after(_key((body["metadata"]["namespace"], body["metadata"]["name"])),
                                 (self.settings.ttl - age).total_seconds())

    async def _write(self, body: dict[str, Any], status: dict[str, Any], reason: str) -> None:
        meta = body["metadata"]
        merged = {**(body.get("status") or {}), **status, "observedGeneration": meta.get("generation")}
        await self.kube.apply_status("intents", meta["namespace"], meta["name"], "Intent",
                                     {k: v for k, v in merged.items() if v is not None}, reason)

    async def _event(self, body: dict[str, Any], reason: str, action: str, note: str, type_: Any = "Normal") -> None:
        meta = body["metadata"]
        await self.recorder.post(ObjectRef(API_VERSION, "Intent", meta["name"], meta["namespace"], meta.get("uid")),
                                 reason, action, note, type_)


def _owned_target(device: dict[str, Any], manager: str) -> dict[str, Any]:
    """Target entries this field manager applied before: a new apply must repeat them, or they are removed."""
    target = (device.get("spec") or {}).get("target") or {}
    owned: dict[str, Any] = {}
    for entry in device["metadata"].get("managedFields") or []:
        if entry.get("manager") != manager or entry.get("operation") != "Apply":
            continue
        fields = ((entry.get("fieldsV1") or {}).get("f:spec") or {}).get("f:target") or {}
        for field in fields:
            key = field.removeprefix("f:")
            if field.startswith("f:") and key in target:
                owned[key] = target[key]
    return owned


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _key(key: tuple[str, str]) -> str:
    return f"{key[0]}/{key[1]}"


def _unkey(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition("/")
    return namespace, name

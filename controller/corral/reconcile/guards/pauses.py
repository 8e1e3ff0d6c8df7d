"""The agents kill switch: the AgentPause of each watched namespace, kept by an informer, and what is in force.

`paused(namespace)` is what the Intent reconciler puts in `Guards.paused` when it decides an Intent and again
right before it runs one. It changes the moment the watch brings the change, and every undecided Intent of
the namespace is decided again then (`on_change`), so a pause also stops what waits for approval or is queued
to run. The controller reads every AgentPause before it decides anything at start: a pause not yet read must
not be a pause missed.

A change (paused, resumed, paused again for another reason) is recorded in the audit log (`agents.paused`,
`agents.resumed`), posted as an Event on the AgentPause and said in its status (`enforced`,
`observedGeneration`), in that order, and only when the status does not show it yet: a change recorded
before a restart is not recorded again, and one made while no controller ran is recorded when one starts.
Deleting the AgentPause resumes agents too (recorded, with no status left to write).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.api.pause import PAUSE_NAME, AgentPauseStatus, Paused, paused_of
from corral.audit.log import AuditLog, Unwritable
from corral.kube.cache import Body, Key, key_of
from corral.kube.events import EventRecorder, ObjectRef
from corral.kube.informer import WatchedKind
from corral.kube.objects import Kube
from corral.kube.workqueue import Result

log = logging.getLogger(__name__)

PAUSED = "agents.paused"
RESUMED = "agents.resumed"
AUDIT_RETRY_S = 1.0


class AgentPauses(WatchedKind):
    def __init__(self, kube: Kube, namespaces: tuple[str, ...], audit: AuditLog, recorder: EventRecorder,
                 on_change: Callable[[str], None] = lambda namespace: None) -> None:
        super().__init__(kube.api, GROUP, VERSION, "agentpauses", namespaces)
        self.kube = kube
        self.audit = audit
        self.recorder = recorder
        self.on_change = on_change  # the namespace whose pause changed: its undecided Intents are decided again
        self.current: dict[str, Paused] = {}  # namespace -> the pause in force there

    def paused(self, namespace: str) -> Paused | None:
        """The pause in force in the namespace now; None: agents act there."""
        return self.current.get(namespace)

    def on_event(self, event_type: str, body: Body) -> None:
        namespace, name = key_of(body)
        if name != PAUSE_NAME:
            return  # the CRD admits no other name
        if event_type == "DELETED":
            self.objects.remove(body)
            if self.current.pop(namespace, None) is not None:
                log.warning("agents resumed in %s: its AgentPause was deleted", namespace)
                self.audit.note(RESUMED, f"{namespace}/{name}", {"paused": False, "deleted": True,
                                                                 "reason": "the AgentPause was deleted"},
                                uid=body["metadata"].get("uid"))
                self.on_change(namespace)
            return
        change = self.objects.upsert(body)
        if change is None:
            return
        now = paused_of(body)
        if now != self.current.get(namespace):
            if now is None:
                self.current.pop(namespace, None)
            else:
                self.current[namespace] = now
            log.warning("%s", now.sentence() if now is not None else f"agents resumed in {namespace}")
            self.on_change(namespace)
        self.queue.add(change.key)

    async def reconcile(self, key: Key) -> Result:
        """Record, announce and acknowledge a change the status does not show yet."""
        body = self.objects.get(key)
        if body is None:
            return Result.done()
        meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
        generation = meta.get("generation")
        paused = paused_of(body)
        if status.get("observedGeneration") == generation and bool(status.get("enforced")) == (paused is not None):
            return Result.done()
        namespace, name = key
        facts: dict[str, Any] = {"paused": paused is not None, "by": spec.get("by"), "reason": spec.get("reason", ""),
                                 "since": spec.get("since"), "generation": generation}
        try:
            await self.audit.append(PAUSED if paused is not None else RESUMED, f"{namespace}/{name}", facts,
                                    uid=meta.get("uid"))
        except Unwritable:
            return Result.after(AUDIT_RETRY_S)  # nothing unrecorded is acknowledged; the pause is in force already
        if paused is not None:
            message = (f"{paused.sentence()} Enforced: every Intent whose requester is not a person ends DENY_PAUSED; "
                       "people's Intents still run.")
        else:
            why = f": {spec['reason']}" if spec.get("reason") else ""
            message = f"Agents are not paused in namespace {namespace}: resumed by {spec.get('by') or 'someone'}{why}."
        self.recorder.post(ObjectRef(API_VERSION, "AgentPause", name, namespace, meta.get("uid")),
                           "AgentsPaused" if paused is not None else "AgentsResumed",
                           "Pause" if paused is not None else "Resume", message,
                           "Warning" if paused is not None else "Normal")
        acknowledged = AgentPauseStatus(enforced=paused is not None, observed_generation=generation,
                                        message=message[:1024])
        written = await self.kube.apply_status("agentpauses", namespace, name, "AgentPause",
                                               acknowledged.model_dump(mode="json", by_alias=True, exclude_none=True),
                                               "agents-paused" if paused is not None else "agents-resumed")
        self.objects.upsert(written)
        return Result.done()

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

Rules have a switch of their own, the AgentPause named `rules` (`rules_paused(namespace)`, what the Intent
reconciler puts in `Guards.rules_paused`): the agents' pause does not stop a Rule a person wrote, the rules' pause
stops every Rule's Intents. It is kept, recorded (`rules.paused`, `rules.resumed`), announced and acknowledged
the same way; `on_rules_change` tells the Rule controller, whose Rules then say they are paused.

AgentPauses are read as `api.pause.AgentPause` models where they enter (kube.watched). One the model refuses is
still read leniently for whether it pauses (`paused_of`: a switch that says paused is paused even if another
field cannot be read), and a Warning Event on it names what was wrong; nothing else is written for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from corral.api.codes import API_VERSION, GROUP, VERSION
from corral.api.pause import PAUSE_NAME, RULES_PAUSE_NAME, AgentPause, AgentPauseStatus, Paused, paused_of
from corral.audit.log import AuditLog, Unwritable
from corral.contract.text import written_text
from corral.kube.cache import Key, TypedChange
from corral.kube.events import EventRecorder, ObjectRef
from corral.kube.objects import Kube
from corral.kube.typed import Malformed
from corral.kube.watched import Refused, WatchedKind
from corral.kube.workqueue import Result

log = logging.getLogger(__name__)

PAUSED = "agents.paused"
RESUMED = "agents.resumed"
RULES_PAUSED = "rules.paused"
RULES_RESUMED = "rules.resumed"
NAMES = (PAUSE_NAME, RULES_PAUSE_NAME)
AUDIT_RETRY_S = 1.0


class AgentPauses(WatchedKind[AgentPause]):
    def __init__(self, kube: Kube, namespaces: tuple[str, ...], audit: AuditLog, recorder: EventRecorder,
                 on_change: Callable[[str], None] = lambda namespace: None) -> None:
        super().__init__(kube.api, AgentPause, GROUP, VERSION, "agentpauses", namespaces)
        self.kube = kube
        self.audit = audit
        self.recorder = recorder
        self.on_change = on_change  # the namespace whose pause changed: its undecided Intents are decided again
        self.on_rules_change: Callable[[str], None] = lambda namespace: None  # the Rules' own switch moved
        self.current: dict[str, Paused] = {}  # namespace -> the pause in force there
        self.rules_current: dict[str, Paused] = {}  # namespace -> the Rules' pause in force there

    def paused(self, namespace: str) -> Paused | None:
        """The pause in force in the namespace now; None: agents act there."""
        return self.current.get(namespace)

    def rules_paused(self, namespace: str) -> Paused | None:
        """The Rules' pause in force in the namespace now; None: Rules act there."""
        return self.rules_current.get(namespace)

    # ---- the AgentPauses --------------------------------------------------------------------------------------

    def changed(self, change: TypedChange[AgentPause]) -> None:
        if change.key[1] not in NAMES:
            return  # the CRD admits no other name
        self._in_force(change.key, in_force(change.after))
        self.queue.add(change.key)

    def refused_one(self, key: Key, refused: Refused) -> None:
        if key[1] not in NAMES:
            return
        self._in_force(key, paused_of(refused.body))
        self.queue.add(key)

    def deleted(self, key: Key, before: AgentPause | None, uid: str | None) -> None:
        namespace, name = key
        if name not in NAMES or self._table(name).pop(namespace, None) is None:
            return
        log.warning("%s resumed in %s: its AgentPause was deleted", _what(name).lower(), namespace)
        self.audit.note(RESUMED if name == PAUSE_NAME else RULES_RESUMED, f"{namespace}/{name}",
                        {"paused": False, "deleted": True, "reason": "the AgentPause was deleted"}, uid=uid)
        self._changed(namespace, name)

    def _table(self, name: str) -> dict[str, Paused]:
        return self.current if name == PAUSE_NAME else self.rules_current

    def _changed(self, namespace: str, name: str) -> None:
        self.on_change(namespace)  # undecided Intents are decided again under either switch
        if name == RULES_PAUSE_NAME:
            self.on_rules_change(namespace)

    def _in_force(self, key: Key, now: Paused | None) -> None:
        namespace, name = key
        table = self._table(name)
        if now == table.get(namespace):
            return
        if now is None:
            table.pop(namespace, None)
        else:
            table[namespace] = now
        what = _what(name)
        log.warning("%s", now.sentence(what) if now is not None else f"{what.lower()} resumed in {namespace}")
        self._changed(namespace, name)

    # ---- recording, announcing and acknowledging --------------------------------------------------------------

    async def reconcile(self, key: Key) -> Result:
        """Record, announce and acknowledge a change the status does not show yet."""
        pause, refused = self.objects.get(key), self.refused.get(key)
        if pause is None:
            if refused is not None:
                self._malformed(key, refused.error, refused.uid)
            return Result.done()
        spec, status, generation = pause.spec, pause.status or AgentPauseStatus(), pause.metadata.generation
        paused = in_force(pause)
        if status.observed_generation == generation and status.enforced == (paused is not None):
            return Result.done()
        namespace, name = key
        facts: dict[str, Any] = {"paused": paused is not None, "by": spec.by, "reason": spec.reason,
                                 "since": spec.model_dump(mode="json")["since"], "generation": generation}
        kinds = (PAUSED, RESUMED) if name == PAUSE_NAME else (RULES_PAUSED, RULES_RESUMED)
        try:
            await self.audit.append(kinds[0] if paused is not None else kinds[1], f"{namespace}/{name}", facts,
                                    uid=pause.metadata.uid)
        except Unwritable:
            return Result.after(AUDIT_RETRY_S)  # nothing unrecorded is acknowledged; the pause is in force already
        what = _what(name)
        message = _message(_what(name), namespace, spec.by, spec.reason, paused)
        self.recorder.post(ObjectRef(API_VERSION, "AgentPause", name, namespace, pause.metadata.uid),
                           f"{what}Paused" if paused is not None else f"{what}Resumed",
                           "Pause" if paused is not None else "Resume", message,
                           "Warning" if paused is not None else "Normal")
        acknowledged = AgentPauseStatus(enforced=paused is not None, observed_generation=generation,
                                        message=message[:1024])
        written = await self.kube.apply_status("agentpauses", namespace, name, "AgentPause",
                                               acknowledged.model_dump(mode="json", by_alias=True, exclude_none=True),
                                               f"{what.lower()}-paused" if paused is not None
                                               else f"{what.lower()}-resumed")
        try:
            self.objects.upsert(written)
        except Malformed:
            pass  # told already, as the watch brings it
        return Result.done()

    def _malformed(self, key: Key, error: Malformed, uid: str | None) -> None:
        namespace, name = key
        self.recorder.post(ObjectRef(API_VERSION, "AgentPause", name, namespace, uid), "Malformed", "Read",
                           f"{error} Whether {_what(name).lower()} are paused is read from spec.paused alone.",
                           "Warning")


def in_force(pause: AgentPause) -> Paused | None:
    """The pause an AgentPause puts in force; None when it is resumed."""
    spec = pause.spec
    if not spec.paused:
        return None
    # Agents are told the reason: made safe as it is read.
    return Paused(namespace=pause.metadata.namespace or "", by=spec.by, reason=written_text(spec.reason),
                  since=spec.since)


def _what(name: str) -> str:
    return "Agents" if name == PAUSE_NAME else "Rules"


# What a switch stops, once enforced: the agents' stops whoever is not a person, the Rules' every Rule.
_ENFORCED = {"Agents": "every Intent whose requester is not a person ends DENY_PAUSED; people's Intents still run.",
             "Rules": "no Rule acts, and every Intent a Rule made that is not decided yet ends DENY_PAUSED."}


def _message(what: str, namespace: str, by: str, reason: str, paused: Paused | None) -> str:
    if paused is not None:
        return f"{paused.sentence(what)} Enforced: {_ENFORCED[what]}"
    why = f": {reason}" if reason else ""
    return f"{what} are not paused in namespace {namespace}: resumed by {by or 'someone'}{why}."

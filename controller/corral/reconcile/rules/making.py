"""A firing's Intents, made under the names its status gave them, and what happens when somebody else holds one.

A firing names its Intents in the Rule's status first (`pending`), then creates them, so a controller that dies in
between makes them after its restart under those very names: once each. A name somebody else took in the meantime
(an agent that read the status and created an Intent under it first) is not the Rule's Intent, whatever label it
carries: the Rule records it (`rule.squatted` in the audit log, the condition IntentNames=False with reason
IntentNameTaken naming who, a Warning Event), writes a fresh random name into its status, and makes its Intent
under that one. The valve still closes. A firing carries out only the revision that fired: a pending Intent of an
earlier generation is dropped, never made from a spec nobody fired.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

from corral.api.codes import API_VERSION
from corral.api.rule import Rule, RuleIntent, RuleStatus
from corral.audit.log import AuditLog
from corral.kube.cache import Key
from corral.kube.conditions import Wanted
from corral.kube.events import EventRecorder, ObjectRef
from corral.reconcile.rules.acting import Acting, Holder, Made, fresh_token, intent_name
from corral.reconcile.rules.status import INTENT_NAMES, with_condition

SQUATTED = "rule.squatted"
NAME_ATTEMPTS = 4  # fresh names tried in one go; an entry still pending is tried again on the next evaluation

Write = Callable[[Key, RuleStatus], Awaitable[RuleStatus]]  # a forced status write; the status as written


def rule_ref(rule: Rule) -> ObjectRef:
    return ObjectRef(API_VERSION, "Rule", rule.metadata.name or "", rule.metadata.namespace, rule.metadata.uid)


def pending_of(status: RuleStatus | None) -> list[RuleIntent]:
    """The newest firing's Intents that are named but not known to be made."""
    if status is None:
        return []
    return [e for e in status.intents if e.pending and e.firing == status.firings]


def fresh_entries(rule: Rule, firing: int, now: datetime) -> list[RuleIntent]:
    """One pending entry per action, each under a new random name."""
    name = rule.metadata.name or ""
    return [RuleIntent(name=intent_name(name, firing, i, fresh_token()), device=action.device, created_at=now,
                       firing=firing, action=i, pending=True) for i, action in enumerate(rule.spec.actions)]


class Making:
    def __init__(self, acting: Acting, audit: AuditLog, recorder: EventRecorder, write: Write) -> None:
        self.acting, self.audit, self.recorder, self.write = acting, audit, recorder, write
        self.squatted: dict[Key, int] = {}  # the firing whose names were taken: IntentNames stays False for it

    async def carry_out(self, key: Key, rule: Rule, status: RuleStatus, now: datetime
                        ) -> tuple[RuleStatus, list[Made]]:
        """Make the newest firing's pending Intents; the status as last written and what each creation said. An
        entry whose fresh names were all taken is left pending for the next call. Raises OSError when the audit log
        cannot be written (nothing is made unrecorded)."""
        pending = pending_of(status)
        if not pending:
            return status, []
        if status.fired_generation != rule.metadata.generation:
            return await self._abandon(key, rule, status, pending), []
        results: list[Made] = []
        for entry in pending:
            if entry.action is None or entry.action >= len(rule.spec.actions):
                continue
            status, made = await self._one(key, rule, status, entry, now)
            if made is not None:
                results.append(made)
        done = {m.name: m.code for m in results}
        intents = [e.model_copy(update={"pending": None, "code": (done[e.name] or "")[:32] or None})
                   if e.name in done else e for e in status.intents]
        conditions = status.conditions
        if not pending_of(status.model_copy(update={"intents": intents})) and self.squatted.get(key) != status.firings:
            conditions = with_condition(conditions, Wanted(
                INTENT_NAMES, "True", "Made", f"The Intents of firing {status.firings} were made under the names the "
                                              f"Rule chose for them.", rule.metadata.generation), now)
        written = await self.write(key, status.model_copy(update={"intents": intents, "conditions": conditions}))
        return written, results

    async def _one(self, key: Key, rule: Rule, status: RuleStatus, entry: RuleIntent, now: datetime
                   ) -> tuple[RuleStatus, Made | None]:
        action = rule.spec.actions[entry.action or 0]
        for _ in range(NAME_ATTEMPTS):
            made = await self.acting.make(rule, entry.name, action)
            if made.taken_by is None:
                return status, made
            status, entry = await self._taken(key, rule, status, entry, made.taken_by, now)
        return status, None

    async def _taken(self, key: Key, rule: Rule, status: RuleStatus, entry: RuleIntent, holder: Holder,
                     now: datetime) -> tuple[RuleStatus, RuleIntent]:
        """Somebody else's Intent holds the name: on record, in the status with a fresh name (written before it is
        made), and told."""
        namespace, name, generation = key[0], key[1], rule.metadata.generation
        fresh = entry.model_copy(update={"name": intent_name(name, status.firings, entry.action or 0, fresh_token()),
                                         "created_at": now})
        await self.audit.append(SQUATTED, f"{namespace}/{name}", {
            "rule": name, "namespace": namespace, "generation": generation, "firing": status.firings,
            "action": entry.action, "device": entry.device, "name": entry.name, "takenBy": holder.requester,
            "holder": holder.what, "instead": fresh.name}, uid=rule.metadata.uid)
        message = (f"Intent name {entry.name} (firing {status.firings}, devices/{entry.device}) was taken by "
                   f"{holder}; the Rule makes its Intent as {fresh.name} instead.")
        intents = [fresh if e.name == entry.name else e for e in status.intents]
        conditions = with_condition(status.conditions, Wanted(INTENT_NAMES, "False", "IntentNameTaken", message,
                                                              generation), now)
        status = await self.write(key, status.model_copy(update={"intents": intents, "conditions": conditions,
                                                                  "message": message[:1024]}))
        self.squatted[key] = status.firings
        self.recorder.post(rule_ref(rule), "IntentNameTaken", "Fire", message[:1024], "Warning")
        return status, fresh

    async def _abandon(self, key: Key, rule: Rule, status: RuleStatus, pending: list[RuleIntent]) -> RuleStatus:
        names = {e.name for e in pending}
        message = (f"Not made: {', '.join(sorted(names))} of firing {status.firings}, which carried out generation "
                   f"{status.fired_generation}; the Rule is now generation {rule.metadata.generation}, and a firing "
                   "carries out only the revision that fired.")
        written = await self.write(key, status.model_copy(update={
            "intents": [e for e in status.intents if e.name not in names], "message": message[:1024]}))
        self.recorder.post(rule_ref(rule), "NotMade", "Fire", message[:1024], "Warning")
        return written

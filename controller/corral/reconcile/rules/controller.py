"""The Rule controller: Rules kept by an informer, one `reconcile(key)` that evaluates a Rule and, when it fires,
acts through Intents in its ServiceAccount's name (acting.py). docs/rules.md tells the whole story.

Keys come from the Rule's own events, from its inputs (a Device's message or status: mqttside.py and the Device
watch, mapped through `RuleInputs`), from the Intents it made (their outcome, by the corral.dev/rule label), from
the Rules' pause and from the timers a verdict asks for (`for`, the cooldown, a reading growing old): never a busy
loop. Only the leader (the replica holding shard 0; a controller alone) evaluates; the others keep their inputs'
readings, so that a new leader judges at once.

A firing is, in this order: its author's rights, against each Device's trusted contract (acting.py); the
`rule.fired` record in the audit log; the status with firings + 1, lastFired and the random names of the Intents
about to be made, pending (the Intent controller finds a Rule's Intents by those names: a label alone proves
nothing, `origin`); the Intents (making.py). A crash after the status write makes the pending names after the
restart; a name somebody else took is reported and replaced: exactly one Intent per action and firing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from corral.api.codes import FINAL_PHASES, GROUP, VERSION
from corral.api.intent import AuditCitation
from corral.api.pause import Paused
from corral.api.rule import RULE_LABEL, Rule, RuleRevision, RuleState, RuleStatus
from corral.audit.log import AuditLog
from corral.decide.approvals import People
from corral.decide.decision import RuleOrigin
from corral.decide.interlocks import Compiled
from corral.decide.revisions import spec_hash
from corral.decide.rules import Evaluation, Memory, accepted, agent_written, compile_condition, judge
from corral.kube.cache import Body, Key, TypedChange, key_of
from corral.kube.conditions import Wanted
from corral.kube.events import EventRecorder
from corral.kube.objects import Kube
from corral.kube.typed import Malformed
from corral.kube.watched import Refused, WatchedKind
from corral.kube.workqueue import Result
from corral.obs.crashpoints import RULE_NAMED, crash_point
from corral.reconcile.intents.facts import StoredIntent
from corral.reconcile.rules.acting import Acting, Authority, label_value, sa_username
from corral.reconcile.rules.inputs import RuleInputs
from corral.reconcile.rules.making import Making, fresh_entries, pending_of, rule_ref
from corral.reconcile.rules.revisions import Revisions
from corral.reconcile.rules.status import (
    CONTRACTS_KNOWN,
    Outcome,
    conditions,
    named,
    recorded,
    refused_of,
    state_of,
    with_condition,
    with_outcomes,
    worth_writing,
)

log = logging.getLogger(__name__)

FIRED = "rule.fired"
RETRY_S = 1.0
SCOPE_RECHECK_S = 30.0  # RBAC is not watched: a Rule refused for its author's rights asks again this often
CONTRACT_RECHECK_S = 2.0  # a Device's contract becomes known with its status or its device's announcement
MAX_OUTCOMES = 1024  # per namespace: the outcomes remembered (a Rule's status keeps its own 16 newest)


class Rules(WatchedKind[Rule]):
    def __init__(self, kube: Kube, namespaces: tuple[str, ...], audit: AuditLog, recorder: EventRecorder,
                 people: People, inputs: RuleInputs, acting: Acting, revisions: Revisions,
                 paused: Callable[[str], Paused | None], rules_paused: Callable[[str], Paused | None],
                 leading: Callable[[], bool]) -> None:
        super().__init__(kube.api, Rule, GROUP, VERSION, "rules", namespaces)
        self.kube, self.audit, self.recorder, self.people = kube, audit, recorder, people
        self.inputs, self.acting, self.revisions = inputs, acting, revisions
        self.paused, self.rules_paused, self.leading = paused, rules_paused, leading
        self.compiled: dict[Key, tuple[int | None, Compiled]] = {}
        self.memory: dict[Key, Memory] = {}  # true_since and last_fired, between evaluations
        self.revised: dict[Key, tuple[int | None, AuditCitation | None]] = {}  # generation -> its rule.revised record
        self.outcomes: dict[str, dict[str, Outcome]] = {}  # namespace -> Intent name -> how it ended
        self.making = Making(acting, audit, recorder, self._forced)

    # ---- events in, keys out --------------------------------------------------------------------------------

    def changed(self, change: TypedChange[Rule]) -> None:
        self.inputs.index(change.key, change.after)
        self.queue.add(change.key)

    def refused_one(self, key: Key, refused: Refused) -> None:
        log.warning("Rule %s/%s is not read: %s", key[0], key[1], refused.error)
        self.inputs.index(key, None)

    def deleted(self, key: Key, before: Rule | None, uid: str | None) -> None:
        self.inputs.index(key, None)
        for table in (self.compiled, self.memory, self.revised, self.making.squatted):
            table.pop(key, None)

    def on_input(self, device_id: str) -> None:
        """A message of a device: the Rules that read it are evaluated again."""
        for key in self.inputs.rules_reading_id(device_id):
            self.queue.add(key)

    def on_device_event(self, body: Body) -> None:
        """A Device changed (created, deleted, its status written by its owner)."""
        namespace, name = key_of(body)
        for key in self.inputs.rules_reading(namespace, name):
            self.queue.add(key)

    def on_intent_event(self, event_type: str, body: Body) -> None:
        """An Intent a Rule made: remember how it ended, and let its Rule say so."""
        labels = (body.get("metadata") or {}).get("labels") or {}
        if RULE_LABEL not in labels or event_type == "DELETED":
            return
        try:
            intent = StoredIntent.model_validate(body)
        except ValueError:
            return
        status = intent.status
        if status is None or status.phase not in FINAL_PHASES or not status.code:
            return
        namespace = intent.metadata.namespace or ""
        self._remember(namespace, intent.metadata.name or "", Outcome(status.code, status.message,
                                                                      intent.spec.requester))
        for key, _ in self.objects.items():
            if key[0] == namespace and label_value(key[1]) == labels[RULE_LABEL]:
                self.queue.add(key)

    def _remember(self, namespace: str, intent: str, outcome: Outcome) -> None:
        known = self.outcomes.setdefault(namespace, {})
        known.pop(intent, None)
        known[intent] = outcome
        while len(known) > MAX_OUTCOMES:
            del known[next(iter(known))]  # the oldest: its Rule's status holds its code by now

    def on_pause_change(self, namespace: str) -> None:
        for key, _ in self.objects.items():
            if key[0] == namespace:
                self.queue.add(key)

    def requeue_all(self) -> None:
        """Became the leader: every Rule is evaluated now."""
        for key, _ in self.objects.items():
            self.queue.add(key)

    # ---- the Intent controller's question -------------------------------------------------------------------

    def origin(self, intent: StoredIntent) -> RuleOrigin | None:
        """The Rule that made this Intent, if the label, the Rule, its status and the requester all say so."""
        meta, namespace = intent.metadata, intent.metadata.namespace or ""
        label = (meta.labels or {}).get(RULE_LABEL)
        if label is None:
            return None
        for (ns, name), rule in self.objects.items():
            if ns != namespace or label_value(name) != label or rule.status is None:
                continue
            listed = any(entry.name == meta.name for entry in rule.status.intents)
            if listed and intent.spec.requester == sa_username(namespace, rule.spec.service_account_name):
                return RuleOrigin(name, agent_written(rule, self.people))
        return None

    # ---- evaluating and acting ------------------------------------------------------------------------------

    async def reconcile(self, key: Key) -> Result:
        rule = self.objects.get(key)
        if rule is None or not self.leading():
            return Result.done()
        try:
            revision = await self._revision(key, rule)
            if pending_of(rule.status):
                rule = await self._carry_out(key, rule, rule.status or RuleStatus(), datetime.now(UTC))
                if pending_of(rule.status):
                    return Result.after(RETRY_S)
        except OSError:  # the audit log cannot be written (Unwritable): nothing acts unrecorded
            return Result.after(RETRY_S)
        namespace, spec, generation = key[0], rule.spec, rule.metadata.generation
        before = rule.status or RuleStatus()
        memory = self.memory.get(key) or Memory(before.true_since, before.last_fired)
        now = datetime.now(UTC)
        evaluation = judge(self._compiled(key, rule), spec, self.inputs.facts(namespace, spec.inputs), memory, now)
        self.memory[key] = memory = Memory(evaluation.true_since, memory.last_fired)
        accepted_by = self._accepted_by(rule)
        status = self._evaluated(rule, before, evaluation, revision, accepted_by, now)
        refused = refused_of(status.intents, before.firings)
        state, message = state_of(evaluation), evaluation.message
        pause = self.rules_paused(namespace) or (self.paused(namespace) if agent_written(rule, self.people) else None)
        if evaluation.verdict == "Invalid":
            pass
        elif accepted_by is None:
            state, message = "AwaitingAcceptance", (f"Written by {spec.author}, who is not a person: nothing acts "
                                                    f"until a person accepts generation {generation}. {message}")
        elif pause is not None:
            state, message = "Paused", f"{pause.sentence('Rules' if self.rules_paused(namespace) else 'Agents')} " \
                                       f"{message}"
        elif evaluation.verdict == "Fire" and spec.dry_run:
            message = f"Dry run: it would fire now, nothing was done. {message}"
        elif evaluation.verdict == "Fire":
            authority = await self.acting.authority(rule)
            if not authority.missing and not authority.unknown:
                return await self._fire(key, rule, self._known(status, generation, now), evaluation, now)
            state, status, message, evaluation = self._not_fired(rule, before, status, evaluation, authority, now)
        elif refused is not None and evaluation.verdict == "CoolingDown":
            outcome = self.outcomes.get(namespace, {}).get(refused.name)
            state, message = "Refused", (f"Its Intent {refused.name} was refused: {refused.code}"
                                         f"{': ' + outcome.message if outcome is not None else ''}. {message}")
        await self._write(key, rule, before, status.model_copy(update={"state": state, "message": message[:1024],
                                                                         "last_evaluated": now}), now)
        self._tell_refusals(rule, before, status)
        return Result.after(evaluation.look_again_s) if evaluation.look_again_s is not None else Result.done()

    def _evaluated(self, rule: Rule, before: RuleStatus, evaluation: Evaluation, revision: AuditCitation | None,
                   accepted_by: str | None, now: datetime) -> RuleStatus:
        """The status as this evaluation sees it: the outcomes of the Rule's own Intents, the revision on record,
        the conditions."""
        namespace, spec, generation = rule.metadata.namespace or "", rule.spec, rule.metadata.generation
        intents = with_outcomes(before.intents, self.outcomes.get(namespace, {}),
                                sa_username(namespace, spec.service_account_name))
        refused = refused_of(intents, before.firings)
        this = RuleRevision(generation=generation, spec_hash=spec_hash(spec), author=spec.author, audit=revision) \
            if revision is not None and generation else None
        return before.model_copy(update={
            "true_since": evaluation.true_since, "intents": intents, "observed_generation": generation,
            "revision_audit": revision or before.revision_audit, "revisions": recorded(before.revisions, this),
            "accepted_generation": generation if accepted_by is not None else before.accepted_generation,
            "code": refused.code if refused is not None else before.code,
            "conditions": conditions(before.conditions, evaluation, accepted_by, spec.author, generation,
                                     spec.max_reading_age_seconds, now.replace(microsecond=0))})

    def _known(self, status: RuleStatus, generation: int | None, now: datetime) -> RuleStatus:
        return status.model_copy(update={"conditions": with_condition(status.conditions, Wanted(
            CONTRACTS_KNOWN, "True", "Known", "The contract of every Device the Rule sets is known: its author's "
                                              "rights were checked against each actuator's level.", generation),
            now.replace(microsecond=0))})

    def _not_fired(self, rule: Rule, before: RuleStatus, status: RuleStatus, evaluation: Evaluation,
                   authority: Authority, now: datetime) -> tuple[RuleState, RuleStatus, str, Evaluation]:
        """Refused before acting: its author lacks a right, or a Device's contract (which says the verb the author
        needs) is not known. Told once, asked again: RBAC is not watched, and a contract becomes known."""
        spec, generation = rule.spec, rule.metadata.generation
        if authority.unknown:
            devices = ", ".join(f"devices/{d}" for d in authority.unknown)
            message = (f"Not fired: the contract of {devices} is not known to the controller yet, so the verb its "
                       f"author {spec.author} needs there (write or config) cannot be checked; it acts once it is.")
            status = status.model_copy(update={"code": None, "conditions": with_condition(
                status.conditions, Wanted(CONTRACTS_KNOWN, "False", "ContractUnknown", message, generation),
                now.replace(microsecond=0))})
            again = CONTRACT_RECHECK_S
        else:
            message = (f"Not fired: its author {spec.author} may not {', '.join(authority.missing)}; a Rule does "
                       f"nothing its author could not.")
            status = self._known(status, generation, now).model_copy(update={"code": "DENY_SCOPE"})
            again = SCOPE_RECHECK_S
        if before.state != "Refused" or before.message != message[:1024]:
            self.recorder.post(rule_ref(rule), "Refused", "Fire", message[:1024], "Warning")
        return "Refused", status, message, Evaluation(evaluation.verdict, message, evaluation.true_since, again)

    async def _fire(self, key: Key, rule: Rule, status: RuleStatus, evaluation: Evaluation, now: datetime) -> Result:
        namespace, name, spec = key[0], key[1], rule.spec
        firing = status.firings + 1
        entries = fresh_entries(rule, firing, now)
        names = [e.name for e in entries]
        try:
            await self.audit.append(FIRED, f"{namespace}/{name}", {
                "rule": name, "namespace": namespace, "generation": rule.metadata.generation, "firing": firing,
                "serviceAccount": sa_username(namespace, spec.service_account_name), "author": spec.author,
                "intents": names, "trueSince": evaluation.true_since.isoformat()
                if evaluation.true_since else None}, uid=rule.metadata.uid)
        except OSError:
            return Result.after(RETRY_S)
        message = f"Fired: {evaluation.message} Its Intents: {', '.join(names)}."
        fired = status.model_copy(update={
            "state": "Fired", "message": message[:1024], "code": None, "last_evaluated": now, "last_fired": now,
            "firings": firing, "intents": named(entries, status.intents),
            "fired_generation": rule.metadata.generation})
        written = await self._forced(key, fired)
        crash_point(RULE_NAMED)
        self.memory[key] = Memory(evaluation.true_since, now)
        self.recorder.post(rule_ref(rule), "Fired", "Fire", message[:1024])
        try:
            await self._carry_out(key, rule, written, now)
        except OSError:
            return Result.after(RETRY_S)
        look_again = evaluation.look_again_s
        return Result.after(look_again) if look_again is not None else Result.done()

    async def _carry_out(self, key: Key, rule: Rule, status: RuleStatus, now: datetime) -> Rule:
        """The firing's pending Intents made (making.py); an Intent the API server refused is remembered as ended.
        The Rule as it stands after the writes."""
        _, results = await self.making.carry_out(key, rule, status, now)
        requester = sa_username(key[0], rule.spec.service_account_name)
        for result in results:
            if result.code is not None:
                self._remember(key[0], result.name, Outcome(result.code, result.message, requester))
                self.queue.add(key)
        return self.objects.get(key) or rule

    async def _revision(self, key: Key, rule: Rule) -> AuditCitation | None:
        """D2's hook, once per generation: the revision on record (rule.revised) and the grants it voids."""
        generation = rule.metadata.generation
        seen = self.revised.get(key)
        if seen is not None and seen[0] == generation:
            return seen[1]
        cited = await self.revisions.observe(rule)
        self.revised[key] = (generation, cited)
        return cited

    def _compiled(self, key: Key, rule: Rule) -> Compiled:
        generation = rule.metadata.generation
        kept = self.compiled.get(key)
        if kept is None or kept[0] != generation:
            kept = self.compiled[key] = (generation, compile_condition(key[1], rule.spec))
        return kept[1]

    def _accepted_by(self, rule: Rule) -> str | None:
        if not accepted(rule, self.people):
            return None
        if self.people.includes(rule.spec.author):
            return rule.spec.author
        return (rule.metadata.annotations or {}).get("corral.dev/accepted", "").partition(":")[2]

    async def _write(self, key: Key, rule: Rule, before: RuleStatus, status: RuleStatus, now: datetime) -> None:
        if worth_writing(status, before, now):
            await self._forced(key, status)

    async def _forced(self, key: Key, status: RuleStatus) -> RuleStatus:
        """Write the status (server-side apply, the controller's field manager); the status as written."""
        body = status.model_dump(mode="json", by_alias=True, exclude_none=True)
        written = await self.kube.apply_status("rules", key[0], key[1], "Rule", body, f"rule-{status.state}".lower())
        try:
            self.objects.upsert(written)
        except Malformed:
            return status
        stored = self.objects.get(key)
        return (stored.status if stored is not None else None) or status

    def _tell_refusals(self, rule: Rule, before: RuleStatus, status: RuleStatus) -> None:
        """An Event for people on each of the Rule's Intents that was refused, once (when its code is first known)."""
        known = {entry.name for entry in before.intents if entry.code is not None}
        for entry in status.intents:
            if entry.code not in (None, "EXECUTED") and entry.name not in known:
                outcome = self.outcomes.get(rule.metadata.namespace or "", {}).get(entry.name)
                why = f": {outcome.message}" if outcome is not None and outcome.message else ""
                self.recorder.post(rule_ref(rule), "Refused", "Fire",
                                   f"Intent {entry.name} on {entry.device} ended {entry.code}{why}"[:1024], "Warning")

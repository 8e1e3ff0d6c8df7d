"""Deciding one Intent: pure, no I/O, fed with everything the decision depends on.

The controller gathers the facts (the contract, the device's online state, the SubjectAccessReview
answer, the approvals, the safety envelope, the clock) and calls `decide()`, which runs one ordered list
of checks, `PIPELINE`; the first check that fails decides. The order is pinned for the whole product:

    withdrawn -> rate limit -> device known -> action known -> arguments -> hold -> RBAC verb -> agents paused
    -> contract hold -> interlocks -> lease -> cited readings -> approval (or a standing grant) -> device online

Reads (`read`) and the overlay (`set_alias`, `set_note`, `set_location`) change nothing on the device and
run shorter pipelines of the same checks. A dry run runs the same checks; the caller only records.

An approval can arrive minutes after the request, so `recheck()` runs the checks whose facts can change
in the meantime (`RECHECKED`) once more right before anything is executed.

Keeping it pure is what lets every path be unit-tested, property-tested, and read in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Literal

from corral.api.codes import DecisionCode
from corral.api.intent import (
    LEASE_ACTIONS,
    LEASE_ACTUATOR,
    MAX_HOLD_S,
    OVERLAY_ACTIONS,
    OVERLAY_LIMITS,
    OVERLAY_VERB,
)
from corral.api.pause import Paused
from corral.contract.freshness import FreshnessRule
from corral.contract.model import Actuator, Contract, Risk
from corral.contract.text import bounded
from corral.contract.values import InvalidValue, Value, check, shown
from corral.decide.approvals import ApprovalView, People, Refusal, judge_approvals
from corral.decide.evidence import NO_EVIDENCE, Evidence, Observation, citation_problem
from corral.decide.grants import GrantView, covering
from corral.decide.ratelimit import Limited, RateLimit

Outcome = Literal["execute", "await_approval", "await_hold", "final"]
Code = DecisionCode


@dataclass(frozen=True)
class Policy:
    """Chart values: how many approvals each risk needs, and the time limits."""

    approvals_required: dict[str, int] = field(
        default_factory=lambda: {"low": 0, "medium": 1, "high": 1, "critical": 1}
    )
    # How old a cited reading may be when its sensor declares no interval, and the most any interval may allow
    # (contract.freshness: 2.5 x the declared interval otherwise).
    freshness: timedelta = timedelta(seconds=2)
    freshness_cap: timedelta = timedelta(seconds=60)
    # How long a request may wait for a human, and how long an approval is good for.
    approval_window: timedelta = timedelta(minutes=5)
    # How long a request waits for a person to accept a held device's changed contract.
    hold_window: timedelta = timedelta(minutes=5)
    # Who may approve (and grant): people, as the chart designates them.
    people: People = field(default_factory=People)
    # A lease's idle TTL when the request names none, and the longest one may ask for.
    lease_ttl: timedelta = timedelta(minutes=5)
    lease_max_ttl: timedelta = timedelta(hours=1)
    # Requests that may reach a device, per requester (corral run --rate-limit; none unless set).
    rate_limit: RateLimit = field(default_factory=RateLimit)

    def freshness_rule(self) -> FreshnessRule:
        return FreshnessRule(self.freshness.total_seconds(), self.freshness_cap.total_seconds())


@dataclass(frozen=True)
class IntentFacts:
    """What was asked (the Intent's spec) and when."""

    uid: str
    name: str
    device: str
    actuator: str
    action: str
    value: object
    requester: str
    created_at: datetime
    based_on: tuple[Observation, ...] = ()
    cancelled: str | None = None  # the requester's reason, once they withdrew it
    holder_id: str | None = None  # which of the requester's clients asks (a lease is held by both together)
    dry_run: bool = False  # only checked, never executed: nobody can approve it
    hold_for_s: float | None = None  # a timed hold (spec.holdFor): put back after this many seconds
    then: object = None  # spec.then.value: what the hold puts back instead of the value from before (None: that)
    rule: RuleOrigin | None = None  # made by a Rule (verified by the controller, never taken from a label alone)


@dataclass(frozen=True)
class RuleOrigin:
    """The Rule an Intent was made by. The agents' pause does not stop a Rule a person wrote or accepted from an
    agent's hand only if a person wrote it: an agent's revision obeys the agents' pause too. Every Rule obeys the
    rules' own pause (`Guards.rules_paused`)."""

    name: str
    agent_written: bool


@dataclass(frozen=True)
class DeviceFacts:
    exists: bool  # the Device is there and its device has announced itself with a contract
    device_id: str | None
    contract: Contract | None
    online: bool | None
    present: bool = True  # the Device object is there (all the overlay needs)
    labels: Mapping[str, str] = field(default_factory=dict)  # the Device's labels (grants select by them)


@dataclass(frozen=True)
class InterlockVerdict:
    """One cross-device rule guarding this action, already evaluated: whether it holds now, and why not."""

    name: str
    holds: bool
    message: str = ""


@dataclass(frozen=True)
class Lease:
    """Exclusive control of the device, held by someone (a username and a holder id) until it expires."""

    holder: str
    expires_at: datetime
    reason: str = ""
    holder_id: str | None = None

    def held_by(self, intent: IntentFacts) -> bool:
        return self.holder == intent.requester and self.holder_id == intent.holder_id

    def who(self) -> str:
        return self.holder + (f" (holder {self.holder_id})" if self.holder_id else "")


@dataclass(frozen=True)
class Broken:
    """A lease a person broke: its holder's next calls are told so, until it would have expired."""

    holder: str
    holder_id: str | None
    by: str
    reason: str
    at: datetime
    until: datetime


@dataclass(frozen=True)
class Guards:
    """The safety envelope around a device, gathered right before deciding (and again before executing).

    Defaults mean "nothing in the way": not paused, not held, no interlock, no lease.
    """

    paused: Paused | None = None  # agents are paused in the Intent's namespace (people's Intents still run)
    rules_paused: Paused | None = None  # Rules are paused there (their own switch, AgentPause `rules`)
    hold: str | None = None  # why the device's changed contract holds it, until a person accepts it
    interlocks: tuple[InterlockVerdict, ...] = ()
    lease: Lease | None = None
    broken: Broken | None = None  # the device's last lease, broken by a person


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    code: Code | None
    message: str
    risk: Risk | None = None
    level: str | None = None
    value: Value | None = None  # the checked value, in its canonical type, when it executes
    approvals: tuple[str, ...] = ()  # names of the approvals this execution consumes
    expires_at: datetime | None = None  # while awaiting approval, or a held device's acceptance
    grant: str | None = None  # the ApprovalGrant whose use this execution consumes, instead of an approval
    refused: tuple[Refusal, ...] = ()  # approvals that do not count, to be marked so on their status


@dataclass(frozen=True)
class Case:
    """Everything one decision depends on."""

    intent: IntentFacts
    device: DeviceFacts
    requester_may: bool
    approvals: Sequence[ApprovalView]
    params_hash: str
    now: datetime
    policy: Policy
    guards: Guards
    evidence: Evidence = NO_EVIDENCE
    grants: Sequence[GrantView] = ()
    limited: Limited | None = None  # the requester is beyond its rate limit (judged by decide.ratelimit)


@dataclass
class _Working:
    """What the checks so far established, for the checks after them."""

    actuator: Actuator | None = None
    value: Value | None = None
    then: Value | None = None  # a timed hold's `then`, checked: decided (grants, approval) with the value
    consumed: tuple[str, ...] = ()
    grant: str | None = None
    refused: tuple[Refusal, ...] = ()

    @property
    def risk(self) -> Risk | None:
        return self.actuator.risk if self.actuator is not None else None

    @property
    def level(self) -> str | None:
        return self.actuator.level if self.actuator is not None else None


CheckFn = Callable[[Case, _Working], Decision | None]


@dataclass(frozen=True)
class Check:
    name: str
    run: CheckFn


def decide(
    intent: IntentFacts,
    device: DeviceFacts,
    requester_may: bool,
    approvals: Sequence[ApprovalView],
    params_hash: str,
    now: datetime,
    policy: Policy = Policy(),
    guards: Guards = Guards(),
    evidence: Evidence = NO_EVIDENCE,
    grants: Sequence[GrantView] = (),
    limited: Limited | None = None,
) -> Decision:
    """One Intent, one outcome: the checks of the pipeline in order; the first that fails decides."""
    case = Case(intent, device, requester_may, approvals, params_hash, now, policy, guards, evidence, grants,
                limited)
    if intent.action == "read":
        return _run(case, READ_PIPELINE)
    if intent.action in OVERLAY_ACTIONS:
        return _run(case, OVERLAY_PIPELINE)
    if intent.action in LEASE_ACTIONS:
        return _run(case, LEASE_PIPELINE)
    return _run(case, PIPELINE)


def recheck(
    intent: IntentFacts,
    device: DeviceFacts,
    requester_may: bool,
    now: datetime,
    guards: Guards = Guards(),
    policy: Policy = Policy(),
) -> Decision | None:
    """The checks whose facts may have changed since the decision, right before executing; None: go ahead.
    `policy` says who is a person (whom a pause does not stop)."""
    case = Case(intent, device, requester_may, (), "", now, policy, guards)
    working = _Working()
    for step in PIPELINE:
        if step.name in RESOLVING or step.name in RECHECKED:
            found = step.run(case, working)
            if found is not None and found.outcome == "await_hold":
                # Held between the decision and now: what was decided on is not what the device now claims.
                return _final("DENY_CONTRACT_HOLD", f"Device {intent.device} was held before this could run: "
                                                    f"{guards.hold}", working)
            if found is not None:
                return found
    return None


def _run(case: Case, pipeline: tuple[Check, ...]) -> Decision:
    working = _Working()
    for step in pipeline:
        found = step.run(case, working)
        if found is not None:
            return replace(found, refused=working.refused)
    risk, level = (working.risk, working.level) if pipeline is PIPELINE else ("low", _level_of(case.intent.action))
    return Decision("execute", None, "Checks passed.", risk, level, working.value, approvals=working.consumed,
                    grant=working.grant, refused=working.refused)


def _level_of(action: str) -> str:
    if action in LEASE_ACTIONS:
        return lease_verb(action)
    return OVERLAY_VERB if action in OVERLAY_ACTIONS else "read"


def lease_verb(action: str) -> str:
    """The RBAC verb a lease action needs: taking or giving back control is a write; breaking another's, approve."""
    return "approve" if action == "break" else "write"


# ---- the checks, in pipeline order --------------------------------------------------------------------------

def _withdrawn(case: Case, _: _Working) -> Decision | None:
    if case.intent.cancelled is None:
        return None
    why = f": {case.intent.cancelled}" if case.intent.cancelled else ""
    return _final("CANCELLED", f"Cancelled by its requester {case.intent.requester}{why}; nothing was executed.")


def _rate_limit(case: Case, _: _Working) -> Decision | None:
    limited = case.limited
    if limited is None:
        return None
    per = limited.limit.per.total_seconds()
    wait = max(0.0, (limited.frees_at - case.now).total_seconds())
    return _final("RATE_LIMITED", f"{case.intent.requester} is over its rate limit: at most {limited.limit.calls} "
                                  f"requests to act on devices at once, refilled at {limited.limit.calls} per {per:g} s "
                                  f"(corral run --rate-limit); {limited.taken} were made in the {per:g} s before "
                                  f"this one. Nothing was sent. The next slot frees at "
                                  f"{limited.frees_at:%H:%M:%S} UTC (in {wait:.0f} s); ask again then.")


def _device_known(case: Case, _: _Working) -> Decision | None:
    if case.device.exists and case.device.contract is not None:
        return None
    # Without a contract nothing can be checked: the device is not there for us.
    where = "does not exist" if not case.device.exists else "has no accepted contract"
    return _final("DEVICE_GONE", f"Device {case.intent.device} {where}; nothing was sent.")


def _action_known(case: Case, working: _Working) -> Decision | None:
    intent, contract = case.intent, case.device.contract
    assert contract is not None  # _device_known ran first
    actuator = contract.actuator(intent.actuator)
    if actuator is not None and actuator.action == intent.action:
        working.actuator = actuator
        return None
    offered = "; ".join(f"{a.id}: {a.action}" for a in contract.actuators) or "none"
    if actuator is None:
        what = f"Device {intent.device} has no actuator {intent.actuator!r}"
    else:
        what = f"actuator {intent.actuator!r} is set with {actuator.action}, not {intent.action}"
    return _final("DENY_UNKNOWN_ACTION", f"{what}. Actions it offers: {offered}.")


def _arguments(case: Case, working: _Working) -> Decision | None:
    assert working.actuator is not None
    try:
        working.value = check(working.actuator, case.intent.value)
    except InvalidValue as err:
        return _final("DENY_ARGUMENTS", f"Invalid value: {err}.", working)
    return None


def _hold(case: Case, working: _Working) -> Decision | None:
    """The timed hold against the actuator's on-time limits: an argument check (DENY_ARGUMENTS), right after the
    value's, so a hold that is missing, too long or leaves the actuator on is refused before anyone is asked."""
    assert working.actuator is not None
    problem = _hold_problem(case.intent, working.actuator, working.value)
    if problem is not None:
        return _final("DENY_ARGUMENTS", problem, working)
    if case.intent.then is not None:
        working.then = check(working.actuator, case.intent.then)  # valid: _hold_problem checked it
    return None


def _hold_problem(intent: IntentFacts, actuator: Actuator, value: Value | None) -> str | None:
    """What is wrong with the Intent's timed hold for this actuator (its on-time limits), if anything."""
    hold, limit, on = intent.hold_for_s, actuator.max_on_seconds, actuator.is_on(value)
    where = f"Actuator {actuator.id} of Device {intent.device}"
    at_most = f" of at most {limit:g} s" if limit is not None else ""
    if hold is not None and not 0 < hold <= MAX_HOLD_S:
        return f"holdFor must be more than 0 and at most {MAX_HOLD_S // 3600}h, not {hold:g} s."
    if hold is None:
        if actuator.hold_required and on:
            stays = (f": its hardware may stay on at most {limit:g} s (maxOnSeconds in its contract)"
                     if limit is not None else ": its contract says it must never be left on")
            return (f"{where} requires a hold (holdFor){at_most} to switch it on ({shown(value)}){stays}, so that it "
                    f"is switched off again by itself. Ask again with holdFor (hold_for_s){at_most}; nothing was "
                    "done.")
        return None
    if actuator.type == "counter" or actuator.action == "set_version":
        return (f"holdFor keeps a state for a while and then puts the earlier one back; {actuator.action} on "
                f"{actuator.id} is not a state that can be put back. Ask without holdFor.")
    if on and limit is not None and hold > limit:
        return (f"holdFor {hold:g} s is longer than {where.lower()} may stay on: at most {limit:g} s (maxOnSeconds "
                "in its contract; its hardware switches itself off after that). Ask again with a shorter hold.")
    if intent.then is None:
        return None
    try:
        then = check(actuator, intent.then)
    except InvalidValue as err:
        return f"Invalid then (the value after the hold): {err}."
    if actuator.hold_required and actuator.is_on(then):
        return (f"then {shown(then)} would leave {where.lower()} on after the hold, and it requires a hold every time "
                f"it is switched on. Leave then out, or set it to {shown(actuator.off_value())}.")
    return None


def _no_hold(case: Case, _: _Working) -> Decision | None:
    """holdFor is for actions that set an actuator (the Intent model refuses it elsewhere; checked here too)."""
    if case.intent.hold_for_s is None and case.intent.then is None:
        return None
    return _final("DENY_ARGUMENTS", f"holdFor and then are for actions that set an actuator; {case.intent.action} "
                                    "sets none. Ask without them.")


def _rbac_verb(case: Case, working: _Working) -> Decision | None:
    if case.requester_may:
        return None
    intent, level = case.intent, working.level
    return _final(
        "DENY_SCOPE",
        f"{intent.requester} may not {level} device {intent.device}: the action needs the '{level}' verb on "
        f"devices/{intent.device} (corral.dev), which Kubernetes RBAC does not grant.",
        working,
    )


def _agents_paused(case: Case, working: _Working) -> Decision | None:
    """The kill switch stops every requester that is not a person; people keep control of their devices. Rules
    have a switch of their own; a Rule an agent wrote obeys both."""
    paused, requester, rule = case.guards.paused, case.intent.requester, case.intent.rule
    # Giving control back is never stopped: a paused agent may still release the lease it holds.
    if case.intent.action == "release":
        return None
    rules_paused = case.guards.rules_paused
    if rule is not None and rules_paused is not None:
        return _final("DENY_PAUSED", f"Made by Rule {rule.name}: {rules_paused.sentence(what='Rules')} Nothing was "
                                     f"done. {rules_paused.resume_hint(what='rules')}", working)
    if rule is not None and not rule.agent_written:
        return None
    if paused is None or case.policy.people.includes(requester):
        return None
    return _final("DENY_PAUSED", f"{paused.sentence()} {requester} is not a person, so nothing was done. "
                                 f"{paused.resume_hint()}", working)


def _contract_hold(case: Case, working: _Working) -> Decision | None:
    hold = case.guards.hold
    if hold is None:
        return None
    intent, window = case.intent, case.policy.hold_window
    expires_at = intent.created_at + window
    if case.now >= expires_at:
        return _final("DENY_CONTRACT_HOLD", f"Device {intent.device} is held and nobody accepted its changed contract "
                                            f"within {_duration(window)} of the request: {hold}", working)
    return Decision("await_hold", None,
                    f"Device {intent.device} is held until a person accepts its changed contract (corral devices "
                    f"accept-contract {intent.device}); waiting until {expires_at:%H:%M:%S} UTC: {hold}",
                    working.risk, working.level, working.value, expires_at=expires_at)


def _interlocks(case: Case, working: _Working) -> Decision | None:
    for verdict in case.guards.interlocks:
        if not verdict.holds:
            return _final("DENY_INTERLOCK", f"Interlock {verdict.name} forbids this now: {verdict.message}", working)
    return None


def _lease(case: Case, working: _Working) -> Decision | None:
    found = _leased_to_another(case)
    return None if found is None else _final("DENY_LEASED", found, working)


def _leased_to_another(case: Case) -> str | None:
    """Why the device is not the requester's to act on now (another holds its lease, or a person broke theirs)."""
    intent, lease, broken = case.intent, case.guards.lease, case.guards.broken
    if (broken is not None and broken.until > case.now and broken.holder == intent.requester
            and broken.holder_id == intent.holder_id and intent.action != "acquire"):
        why = f": {broken.reason}" if broken.reason else ""
        return (f"Your lease of Device {intent.device} was broken by {broken.by} at {broken.at:%H:%M:%S} UTC{why}. "
                "Nothing was done; a person has taken over. Acquire it again only if they agree.")
    if lease is None or lease.expires_at <= case.now or lease.held_by(intent):
        return None
    why = f" ({lease.reason})" if lease.reason else ""
    return (f"Device {intent.device} is leased to {lease.who()}{why} until {lease.expires_at:%H:%M:%S} UTC unless "
            "renewed; only its holder acts on it, or a person with approve breaks the lease (corral lease break).")


def _cited_readings(case: Case, working: _Working) -> Decision | None:
    problem = _check_observations(case)
    return None if problem is None else _final("DENY_SENSOR", problem, working)


def _approval(case: Case, working: _Working) -> Decision | None:
    assert working.actuator is not None
    intent, policy, actuator = case.intent, case.policy, working.actuator
    needed = policy.approvals_required.get(actuator.risk, 1)
    if needed <= 0:
        return None
    verdict = judge_approvals(case.approvals, intent.uid, case.params_hash, intent.requester, needed, case.now,
                              policy.approval_window, policy.people)
    working.refused = verdict.refused
    if verdict.state == "denied":
        return _final("DENIED_BY_APPROVER", verdict.message, working)
    if verdict.state == "approved":
        working.consumed = verdict.approvals
        return None
    # A hold's `then` is put back later with no decision of its own: a grant covers the hold only if it covers both.
    grants = covering(case.grants, intent.requester, intent.device, case.device.labels, actuator.id, working.value,
                      actuator.risk, case.now, policy.people, then=working.then)
    if grants:
        working.grant = grants[0].name
        return None
    verdict = replace(verdict, message=verdict.message + _then_not_granted(case, working))
    expires_at = intent.created_at + policy.approval_window
    if intent.dry_run:  # a dry run is never approved: saying how to approve it would send people to a dead end
        return Decision("await_approval", None, f"Risk {actuator.risk}: a real request would wait for {needed} "
                        f"approval(s) by a person other than {intent.requester}; this dry run cannot be approved.",
                        actuator.risk, actuator.level, working.value, expires_at=expires_at)
    if case.now >= expires_at:
        return _final("DENY_APPROVAL", f"No valid approval arrived within {_duration(policy.approval_window)} of the "
                                       f"request; it expired. {verdict.message}", working)
    return Decision(
        "await_approval", None,
        f"Risk {actuator.risk}: waiting for {needed} approval(s) by a person other than {intent.requester} "
        f"until {expires_at:%H:%M:%S} UTC (corral approve {intent.name}). {verdict.message}",
        actuator.risk, actuator.level, working.value, expires_at=expires_at,
    )


def _then_not_granted(case: Case, working: _Working) -> str:
    """Why a grant that covers the value does not let the hold run: it does not cover `then` ("" otherwise)."""
    if working.then is None or working.actuator is None:
        return ""
    intent, actuator = case.intent, working.actuator
    alone = covering(case.grants, intent.requester, intent.device, case.device.labels, actuator.id, working.value,
                     actuator.risk, case.now, case.policy.people)
    if not alone:
        return ""
    return (f" ApprovalGrant {alone[0].name} covers {actuator.id}={shown(working.value)} but not the value after the "
            f"hold (then {shown(working.then)}), so a person decides on both.")


def _device_online(case: Case, working: _Working) -> Decision | None:
    if case.device.online:
        return None
    what = "it cannot be read now" if case.intent.action == "read" else "nothing was sent"
    return _final("DEVICE_GONE", f"Device {case.intent.device} is offline; {what}.", working)


# A fresh read changes nothing on the device: it needs the read verb and an online device, no approval;
# pause, holds, interlocks and leases guard actions, not reads.
def _readable(case: Case, _: _Working) -> Decision | None:
    contract = case.device.contract
    assert contract is not None
    readable = [a.id for a in contract.actuators] + [s.metric for s in contract.sensors]
    if case.intent.actuator in readable:
        return None
    return _final("DENY_UNKNOWN_ACTION", f"Device {case.intent.device} has nothing named {case.intent.actuator!r} "
                                         f"to read. Readable: {', '.join(readable) or 'nothing'}.")


def _may_read(case: Case, _: _Working) -> Decision | None:
    if case.requester_may:
        return None
    intent = case.intent
    return _final("DENY_SCOPE", f"{intent.requester} may not read device {intent.device}: reading needs the "
                                f"'read' verb on devices/{intent.device} (corral.dev).", "low", "read")


def _fixed(check: CheckFn, risk: Risk, level: str) -> CheckFn:
    """A check of the main pipeline for a shorter one whose risk and level do not come from an actuator."""
    def run(case: Case, working: _Working) -> Decision | None:
        found = check(case, working)
        if found is None:
            return None
        assert found.code is not None  # these checks only ever decide finally
        return _final(found.code, found.message, risk, level)
    return run


# The overlay is what people call the device and where it is; it never reaches the device, so it needs only
# the Device object, a clean text and the `annotate` verb (and agents not paused).
def _device_present(case: Case, _: _Working) -> Decision | None:
    if case.device.present:
        return None
    return _final("DEVICE_GONE", f"Device {case.intent.device} does not exist; nothing was changed.")


def _overlay_text(case: Case, working: _Working) -> Decision | None:
    field_name = OVERLAY_ACTIONS[case.intent.action]
    value = case.intent.value
    if case.intent.actuator != field_name or not isinstance(value, str):
        return _final("DENY_ARGUMENTS", f"{case.intent.action} sets the overlay field {field_name!r} to a string "
                                        f"(at most {OVERLAY_LIMITS[field_name]} characters; empty deletes it).",
                      "low", OVERLAY_VERB)
    # Made safe the way device text is (no control, invisible or bidi characters, one line), then cut.
    working.value = bounded(value, OVERLAY_LIMITS[field_name])
    return None


def _may_annotate(case: Case, _: _Working) -> Decision | None:
    if case.requester_may:
        return None
    intent = case.intent
    return _final("DENY_SCOPE", f"{intent.requester} may not change the overlay of device {intent.device}: it needs "
                                f"the '{OVERLAY_VERB}' verb on devices/{intent.device} (corral.dev).", "low", OVERLAY_VERB)


PIPELINE: tuple[Check, ...] = (
    Check("withdrawn", _withdrawn),
    Check("rate limit", _rate_limit),
    Check("device known", _device_known),
    Check("action known", _action_known),
    Check("arguments", _arguments),
    Check("hold", _hold),
    Check("RBAC verb", _rbac_verb),
    Check("agents paused", _agents_paused),
    Check("contract hold", _contract_hold),
    Check("interlocks", _interlocks),
    Check("lease", _lease),
    Check("cited readings", _cited_readings),
    Check("approval", _approval),
    Check("device online", _device_online),
)
READ_PIPELINE: tuple[Check, ...] = (
    Check("withdrawn", _withdrawn),
    Check("device known", _device_known),
    Check("action known", _readable),
    Check("arguments", _fixed(_no_hold, "low", "read")),
    Check("RBAC verb", _may_read),
    Check("cited readings", _fixed(_cited_readings, "low", "read")),
    Check("device online", _fixed(_device_online, "low", "read")),
)
OVERLAY_PIPELINE: tuple[Check, ...] = (
    Check("withdrawn", _withdrawn),
    Check("device known", _device_present),
    Check("arguments", _overlay_text),
    Check("no hold", _fixed(_no_hold, "low", OVERLAY_VERB)),
    Check("RBAC verb", _may_annotate),
    Check("agents paused", _fixed(_agents_paused, "low", OVERLAY_VERB)),
)
# A lease is taken, given back or broken on the Device object alone: the device itself is not involved.
def _lease_arguments(case: Case, working: _Working) -> Decision | None:
    intent, policy = case.intent, case.policy
    level = lease_verb(intent.action)
    if intent.actuator != LEASE_ACTUATOR:
        return _final("DENY_ARGUMENTS", f"{intent.action} acts on the lease: actuator must be {LEASE_ACTUATOR!r}.",
                      "low", level)
    held = _no_hold(case, working)
    if held is not None:
        return replace(held, risk="low", level=level)
    if intent.action != "acquire":
        return None
    ttl = intent.value if intent.value is not None else int(policy.lease_ttl.total_seconds())
    longest = int(policy.lease_max_ttl.total_seconds())
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= longest:
        return _final("DENY_ARGUMENTS", f"A lease's idle TTL is 1 to {longest} whole seconds, not {ttl!r}.", "low",
                      level)
    working.value = ttl
    return None


def _may_lease(case: Case, _: _Working) -> Decision | None:
    if case.requester_may:
        return None
    intent, verb = case.intent, lease_verb(case.intent.action)
    what = {"acquire": "take exclusive control of", "release": "give back", "break": "break the lease of"}[intent.action]
    return _final("DENY_SCOPE", f"{intent.requester} may not {what} device {intent.device}: it needs the '{verb}' "
                                f"verb on devices/{intent.device} (corral.dev).", "low", verb)


def _lease_action(case: Case, working: _Working) -> Decision | None:
    intent, lease = case.intent, case.guards.lease
    level = lease_verb(intent.action)
    current = lease if lease is not None and lease.expires_at > case.now else None
    if intent.action == "break":
        if current is None:
            return _final("EXECUTED", f"Device {intent.device} has no lease; nothing to break.", "low", level)
        return None
    if current is not None and not current.held_by(intent):
        return _final("DENY_LEASED", _leased_to_another(case) or "", "low", level)
    if intent.action == "release" and current is None:
        return _final("EXECUTED", f"Device {intent.device} has no lease of yours; nothing to release.", "low", level)
    return None


LEASE_PIPELINE: tuple[Check, ...] = (
    Check("withdrawn", _withdrawn),
    Check("device known", _device_present),
    Check("arguments", _lease_arguments),
    Check("RBAC verb", _may_lease),
    Check("agents paused", _fixed(_agents_paused, "low", "write")),
    Check("lease", _lease_action),
)
# Checks that only establish what is asked (they cannot change after the request), and the ones whose facts
# can change while a request waits for a human.
RESOLVING = frozenset({"device known", "action known", "arguments", "hold"})
RECHECKED = frozenset({"withdrawn", "RBAC verb", "agents paused", "contract hold", "interlocks", "lease"})


def _check_observations(case: Case) -> str | None:
    intent, device = case.intent, case.device
    assert device.contract is not None
    return citation_problem(intent.based_on, device.device_id or intent.device, device.device_id, device.contract,
                            case.evidence, case.policy.freshness_rule(), case.now)


def _final(code: Code, message: str, working: _Working | Risk | None = None, level: str | None = None) -> Decision:
    if isinstance(working, _Working):
        return Decision("final", code, message, working.risk, working.level)
    return Decision("final", code, message, working, level)


def _duration(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds < 120:
        return f"{seconds:g} seconds"
    return f"{seconds / 60:g} minutes"

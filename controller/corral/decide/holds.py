"""Timed holds: what a hold puts back, and at its end whether and how it does. Pure, no I/O.

An executed Intent with `holdFor` leaves a Pending hold in its status (`pending_hold`): when it runs out the
controller puts back the value from before (or `then`). At that moment `judge_revert` decides on facts the
controller gathered (the Device's target as the API server has it now, the Intents executed since, the current
contract, the interlocks guarding the value to put back):

1. Cancelled when someone else changed the actuator meanwhile: another Intent executed on it after this one, or
   spec.target of the actuator is no longer the held value (or another field manager took it over).
2. Otherwise the revert passes exactly these checks: the device is known with a contract, the value is still
   valid for that contract, and no interlock guarding the value forbids it. It is covered by the original
   Intent's decision (its RBAC verb, approval, lease and pause were judged then), so nothing else may stop it:
   putting back the earlier state must never fail unsafe.
3. An interlock forbids the earlier value: the actuator's failsafe value where it has one (the contract's own
   safe state, which the firmware takes with no controller at all), else Refused (the actuator stays).

Only a value the Intent's decision covered skips the pause, the lease and the approval: the value from before
(no `then`), or a `then` that was decided, granted or approved with the main value (status.paramsHash is the
hash with `then` in it). A `then` that was not (an Intent decided before `then` was part of the request,
`revert_covered`) is a new request at the revert: `checks` is the normal pipeline's decision on it, gathered
by the controller, and only "execute" puts it back. No person can be waiting for a revert, so one that needs
an approval is Refused, and so is every other refusal: the actuator keeps the value a person did approve
(never the failsafe value, which is no less a value nobody approved here).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from corral.api.codes import INTENTS_MANAGER
from corral.contract.model import Actuator
from corral.contract.values import InvalidValue, check, shown
from corral.decide.decision import Decision, InterlockVerdict

RevertKind = Literal["revert", "failsafe", "Cancelled", "Refused"]


def revert_command_id(intent_uid: str) -> str:
    """The revert's command id: from the Intent's uid like its own command id (so a restart resends the same
    one), and distinct from it ("r-" against "i-"), so the firmware's dedup does not take it for the first."""
    return "r-" + hashlib.sha256(intent_uid.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class PendingHold:
    revert_to: object  # None: nothing is known to put back (judged Refused when the hold runs out)
    message: str


def pending_hold(actuator: Actuator, value: object, then: object, before: Mapping[str, object],
                 hold_s: float, earlier: tuple[str, object] | None = None) -> PendingHold:
    """The hold an executed Intent leaves: the value `then` names, else the one the device reported before. A hold
    that replaces another one still pending on the actuator (`earlier`: that Intent and its revertTo; its own
    revert is cancelled by this Intent) puts back what that one would have: extending a hold must not make its
    "on" the value from before. An actuator that requires a hold is never put back to on (someone's earlier "on"
    would then have no limit): its off value instead."""
    if then is not None:
        revert_to, why = then, "spec.then"
    elif earlier is not None:
        revert_to, why = earlier[1], f"the value from before the hold of Intent {earlier[0]}, which this one replaces"
    else:
        revert_to, why = before.get(actuator.id), "the value the device reported before"
    if revert_to is None:
        return PendingHold(None, f"Holding {actuator.id}={shown(value)} for {hold_s:g} s; the device reported no "
                                 f"value of {actuator.id} before, so there is nothing known to put back.")
    if actuator.hold_required and actuator.is_on(revert_to):
        off = actuator.off_value()
        return PendingHold(off, f"Holding {actuator.id}={shown(value)} for {hold_s:g} s, then {shown(off)}: the value "
                                f"from before ({shown(revert_to)}) is on, and {actuator.id} requires a hold every "
                                "time it is switched on.")
    return PendingHold(revert_to, f"Holding {actuator.id}={shown(value)} for {hold_s:g} s, then putting back "
                                  f"{shown(revert_to)} ({why}).")


@dataclass(frozen=True)
class TargetNow:
    """spec.target[actuator] of the Device as the API server has it now (read fresh, not from a cache)."""

    present: bool
    value: object = None
    manager: str | None = None  # the field manager that owns it (managedFields)
    intent: str | None = None  # the Intent whose apply last wrote the Device's target (its annotation)


@dataclass(frozen=True)
class LaterIntent:
    """Another Intent executed on the same device and actuator after the held one."""

    name: str
    requester: str


@dataclass(frozen=True)
class HoldFacts:
    intent: str  # the held Intent's name
    device: str
    actuator_id: str
    held: object  # the value the Intent set and holds
    revert_to: object  # status.hold.revertTo
    target: TargetNow | None  # None: the Device is gone
    later: LaterIntent | None
    actuator: Actuator | None  # in the device's current contract; None: not known, or no contract
    interlocks: tuple[InterlockVerdict, ...] = ()  # the interlocks guarding revert_to, judged now
    uncovered: str | None = None  # why the Intent's decision does not cover revert_to (None: it does)
    checks: Decision | None = None  # when uncovered: the normal pipeline's decision on revert_to as a new request


def revert_covered(then_set: bool, decided_hash: str | None, hash_now: str) -> str | None:
    """Why the value a hold puts back is not covered by its Intent's decision, or None when it is. Without `then`
    it is the value from before, which the hold records and the design puts back unasked. With `then`, only a
    decision bound to the hash that holds `then` (decide.idempotency.params_hash) covered it; an Intent decided
    before that rule carries the older hash in status.paramsHash."""
    if not then_set or decided_hash == hash_now:
        return None
    return ("it was decided before spec.then was part of what an approval or a grant covers (its "
            "status.paramsHash leaves then out)")


@dataclass(frozen=True)
class Revert:
    kind: RevertKind
    value: object
    message: str


def judge_revert(facts: HoldFacts) -> Revert:
    """The hold ran out: cancel it, put the value back, fall back to the failsafe value, or refuse (see module)."""
    changed = _changed_by(facts)
    if changed is not None:
        return Revert("Cancelled", None, f"Not put back: {changed} since this Intent set {facts.actuator_id}="
                                         f"{shown(facts.held)}; the newer setting stands.")
    actuator, where = facts.actuator, f"{facts.actuator_id} of Device {facts.device}"
    if facts.target is None or actuator is None:
        what = "is gone" if facts.target is None else "has no known contract"
        return Revert("Refused", None, f"Nothing was put back: Device {facts.device} {what}.")
    if facts.revert_to is None:
        return Revert("Refused", None, f"Nothing was put back: there was no value of {where} known from before "
                                       f"(and no spec.then); {facts.actuator_id} stays {shown(facts.held)}.")
    try:
        value = check(actuator, facts.revert_to)
    except InvalidValue as err:
        return Revert("Refused", None, f"Nothing was put back: {shown(facts.revert_to)} is no longer a valid value "
                                       f"of {where} ({err}); it stays {shown(facts.held)}.")
    if facts.uncovered is not None:
        return _as_a_new_request(facts, value)
    forbidding = next((v for v in facts.interlocks if not v.holds), None)
    if forbidding is None:
        return Revert("revert", value, f"The hold ran out: putting back {facts.actuator_id}={shown(value)}.")
    said = f"Interlock {forbidding.name} forbids {facts.actuator_id}={shown(value)}: {forbidding.message}"
    if actuator.failsafe is not None:
        failsafe = actuator.failsafe.value
        return Revert("failsafe", failsafe, f"The hold ran out. {said}; setting the actuator's failsafe value "
                                            f"{facts.actuator_id}={shown(failsafe)} instead.")
    return Revert("Refused", None, f"The hold ran out. {said}. {facts.actuator_id} has no failsafe value, so it "
                                   f"stays {shown(facts.held)}; a person must decide.")


def _as_a_new_request(facts: HoldFacts, value: object) -> Revert:
    """A `then` the Intent's decision did not cover: put back only if it passes every check of a new request."""
    said = f"{facts.actuator_id}={shown(value)} (spec.then) is not covered by this Intent's approval: {facts.uncovered}"
    checks = facts.checks
    if checks is not None and checks.outcome == "execute":
        return Revert("revert", value, f"The hold ran out: putting back {facts.actuator_id}={shown(value)}. {said}; "
                                       "it passed the checks of a new request (pause, lease, interlocks, approval).")
    if checks is None:
        why = "it was not checked"
    elif checks.outcome == "await_approval":
        why = f"at risk {checks.risk} it needs a person's approval, which a revert cannot wait for"
    elif checks.outcome == "await_hold":
        why = f"{checks.message}"
    else:
        why = f"it would be refused {checks.code}: {checks.message}"
    return Revert("Refused", None, f"The hold ran out. Not put back: {said}, so it must pass the checks of a new "
                                   f"request, and {why}. {facts.actuator_id} stays {shown(facts.held)}; a person "
                                   "must decide.")


def _changed_by(facts: HoldFacts) -> str | None:
    """Who changed the actuator since the hold began, or None when it still holds the held value."""
    if facts.later is not None:
        return f"{facts.actuator_id} was changed by Intent {facts.later.name} of {facts.later.requester}"
    target = facts.target
    if target is None:
        return None
    if not target.present:
        by = f" (by field manager {target.manager})" if target.manager else ""
        return f"spec.target.{facts.actuator_id} was removed{by}"
    if target.value == facts.held and target.manager in (None, INTENTS_MANAGER):
        return None
    if target.manager == INTENTS_MANAGER and target.intent and target.intent != facts.intent:
        return (f"spec.target.{facts.actuator_id} changed to {shown(target.value)} (by Intent {target.intent}, "
                f"field manager {target.manager})")
    by = f" (by field manager {target.manager})" if target.manager else ""
    if target.value == facts.held:
        return f"spec.target.{facts.actuator_id} was taken over{by}"
    return f"spec.target.{facts.actuator_id} changed to {shown(target.value)}{by}"

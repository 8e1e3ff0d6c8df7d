"""A Rule's status: its state in a sentence, its conditions, the Intents it made and how they ended, and when a
write is worth making.

Written with server-side apply on the status subresource, and only when something a reader acts on changed:
the state, the code, trueSince, lastFired, firings, the Intents, a condition's status or reason, the generation
seen or the revision's audit record. The message alone (which says "held for 1.4 s of 3 s") and lastEvaluated do
not make a write: they ride along with one, or are refreshed at most every `REFRESH_S` seconds while the Rule is
evaluated (on every input message, so an idle Rule with a sensor reporting twice a second costs two writes a
minute at most, not 120).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from corral.api.base import Condition
from corral.api.rule import MAX_RULE_INTENTS, MAX_RULE_REVISIONS, RuleIntent, RuleRevision, RuleState, RuleStatus
from corral.decide.rules import Evaluation
from corral.kube.conditions import Wanted, merge

REFRESH_S = 30.0
COMPILED, INPUTS_FRESH, ACCEPTED = "Compiled", "InputsFresh", "Accepted"
CONTRACTS_KNOWN, INTENT_NAMES = "ContractsKnown", "IntentNames"  # set when it fires, kept between evaluations


@dataclass(frozen=True)
class Outcome:
    """How one of the Rule's Intents ended (its final code and message), as its watch event said, and who asked for
    it: an Intent under a name the Rule chose counts as the Rule's only when its requester is the Rule's
    ServiceAccount (anybody may create one under that name, with the Rule's label)."""

    code: str
    message: str
    requester: str


def conditions(previous: list[Condition], evaluation: Evaluation, accepted_by: str | None, author: str,
               generation: int | None, max_age_s: int, now: datetime) -> list[Condition]:
    """Compiled, InputsFresh and Accepted, each with a reason; a transition time only when its status moved."""
    if evaluation.verdict == "Invalid" and "does not compile" in evaluation.message:
        compiled = Wanted(COMPILED, "False", "CompileError", evaluation.message, generation)
        fresh = Wanted(INPUTS_FRESH, "Unknown", "NotEvaluated", "The condition does not compile.", generation)
    else:
        compiled = Wanted(COMPILED, "True", "Compiled", "The condition compiled to a boolean expression.", generation)
        fresh = _fresh(evaluation, generation, max_age_s)
    if accepted_by is None:
        accepted = Wanted(ACCEPTED, "False", "AwaitingAcceptance",
                          f"Generation {generation} was written by {author}, who is not a person; it acts once a "
                          f"person accepts it (corral rules accept).", generation)
    elif accepted_by == author:
        accepted = Wanted(ACCEPTED, "True", "WrittenByPerson", f"Written by {author}.", generation)
    else:
        accepted = Wanted(ACCEPTED, "True", "AcceptedByPerson",
                          f"Written by {author}; generation {generation} accepted by {accepted_by}.", generation)
    kept = [c for c in previous if c.type in (CONTRACTS_KNOWN, INTENT_NAMES)]
    return merge(previous, [compiled, fresh, accepted], now) + kept


def with_condition(previous: list[Condition], wanted: Wanted, now: datetime) -> list[Condition]:
    """One condition set (its transition time kept when its status did not move), the others as they were."""
    new = merge(previous, [wanted], now)[0]
    if all(c.type != wanted.type for c in previous):
        return [*previous, new]
    return [new if c.type == wanted.type else c for c in previous]


def _fresh(evaluation: Evaluation, generation: int | None, max_age_s: int) -> Wanted:
    if not evaluation.stale:
        return Wanted(INPUTS_FRESH, "True", "Fresh",
                      f"Every input is online, and the readings the condition reads are younger than {max_age_s} s.",
                      generation)
    first = evaluation.stale[0]
    reason = "InputOffline" if "offline" in first else "InputMissing" if "missing" in first else "ReadingStale"
    return Wanted(INPUTS_FRESH, "False", reason, "; ".join(evaluation.stale) + ".", generation)


def with_outcomes(intents: list[RuleIntent], outcomes: dict[str, Outcome], requester: str) -> list[RuleIntent]:
    """The Intents as status lists them, with each final code known now filled in: only of an Intent the Rule's
    ServiceAccount asked for."""
    filled = []
    for entry in intents:
        outcome = outcomes.get(entry.name)
        if entry.code is None and outcome is not None and outcome.requester == requester:
            entry = entry.model_copy(update={"code": outcome.code[:32]})
        filled.append(entry)
    return filled


def named(new: list[RuleIntent], earlier: list[RuleIntent]) -> list[RuleIntent]:
    """The newest firing's Intents first, then the earlier ones, the last MAX_RULE_INTENTS."""
    return new[:MAX_RULE_INTENTS] + earlier[:max(0, MAX_RULE_INTENTS - len(new))]


def refused_of(intents: list[RuleIntent], firing: int) -> RuleIntent | None:
    """The first of the Intents of this firing (the newest) that ended with anything but EXECUTED."""
    return next((entry for entry in intents if entry.firing == firing and entry.code not in (None, "EXECUTED")), None)


def recorded(revisions: list[RuleRevision], new: RuleRevision | None) -> list[RuleRevision]:
    """The recorded revisions, newest first, with `new` (a generation the controller just recorded)."""
    if new is None or any(r.generation == new.generation and r.spec_hash == new.spec_hash for r in revisions):
        return revisions
    kept = [r for r in revisions if r.generation != new.generation]
    return [new, *kept][:MAX_RULE_REVISIONS]


def significant(status: RuleStatus) -> tuple[object, ...]:
    """What a reader acts on: a change of any of it is written at once."""
    return (status.state, status.code, status.true_since, status.last_fired, status.firings,
            [entry.model_dump() for entry in status.intents], status.accepted_generation,
            status.revision_audit.model_dump() if status.revision_audit is not None else None,
            [r.model_dump() for r in status.revisions], status.fired_generation,
            [(c.type, c.status, c.reason) for c in status.conditions], status.observed_generation)


def worth_writing(new: RuleStatus, old: RuleStatus, now: datetime) -> bool:
    if significant(new) != significant(old):
        return True
    if new.message == old.message:
        return False
    return old.last_evaluated is None or now - old.last_evaluated >= timedelta(seconds=REFRESH_S)


def state_of(evaluation: Evaluation) -> RuleState:
    """The state a verdict shows when nothing else (acceptance, a pause, a refusal) says more."""
    if evaluation.verdict == "Fire":
        return "Fired"
    return evaluation.verdict

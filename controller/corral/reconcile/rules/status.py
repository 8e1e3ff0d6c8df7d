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
from corral.api.rule import MAX_RULE_INTENTS, RuleIntent, RuleState, RuleStatus
from corral.decide.rules import Evaluation
from corral.kube.conditions import Wanted, merge

REFRESH_S = 30.0
COMPILED, INPUTS_FRESH, ACCEPTED = "Compiled", "InputsFresh", "Accepted"


@dataclass(frozen=True)
class Outcome:
    """How one of the Rule's Intents ended (its final code and message), as its watch event said."""

    code: str
    message: str


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
    return merge(previous, [compiled, fresh, accepted], now)


def _fresh(evaluation: Evaluation, generation: int | None, max_age_s: int) -> Wanted:
    if not evaluation.stale:
        return Wanted(INPUTS_FRESH, "True", "Fresh",
                      f"Every input is online, and the readings the condition reads are younger than {max_age_s} s.",
                      generation)
    first = evaluation.stale[0]
    reason = "InputOffline" if "offline" in first else "InputMissing" if "missing" in first else "ReadingStale"
    return Wanted(INPUTS_FRESH, "False", reason, "; ".join(evaluation.stale) + ".", generation)


def with_outcomes(intents: list[RuleIntent], outcomes: dict[str, Outcome]) -> list[RuleIntent]:
    """The Intents as status lists them, with each final code known now filled in."""
    filled = []
    for entry in intents:
        outcome = outcomes.get(entry.name)
        if entry.code is None and outcome is not None:
            entry = entry.model_copy(update={"code": outcome.code[:32]})
        filled.append(entry)
    return filled


def made(names: list[tuple[str, str]], earlier: list[RuleIntent], now: datetime) -> list[RuleIntent]:
    """The newest firing's Intents first, then the earlier ones, the last MAX_RULE_INTENTS."""
    return [RuleIntent(name=name, device=device, created_at=now) for name, device in names][:MAX_RULE_INTENTS] \
        + earlier[:max(0, MAX_RULE_INTENTS - len(names))]


def refused_of(intents: list[RuleIntent], names: set[str]) -> RuleIntent | None:
    """The first of the Intents `names` (the newest firing's) that ended with anything but EXECUTED."""
    return next((entry for entry in intents if entry.name in names and entry.code not in (None, "EXECUTED")), None)


def significant(status: RuleStatus) -> tuple[object, ...]:
    """What a reader acts on: a change of any of it is written at once."""
    return (status.state, status.code, status.true_since, status.last_fired, status.firings,
            [entry.model_dump() for entry in status.intents], status.accepted_generation,
            status.revision_audit.model_dump() if status.revision_audit is not None else None,
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

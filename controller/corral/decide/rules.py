"""Rules, judged: whether a Rule fires now, and when to look again. Pure, no I/O.

A Rule's condition is CEL in the Interlocks' environment (`decide.interlocks`: the same compiler, extensions,
iteration budget and time limit), over its inputs only:

    devices   input name -> {"reported": actuator id -> value, "online": bool}
    readings  input name -> metric -> latest value, only readings received less than maxReadingAgeSeconds ago

Where an Interlock *forbids* on a missing key (silence is not consent), a Rule must not *act* on it: an input
that is missing or offline, or a reading the condition needs that is missing or too old, makes the Rule
`Stale`, naming which, and it does not fire. Old data neither fires nor arms a Rule: `true_since` starts over.

The verdicts, in the order they are judged:

    Invalid      the condition does not compile, or cannot be evaluated over these inputs (not a boolean, a type
                 error, beyond the cost bound)
    Stale        an input is missing or offline, or a reading the condition reads is missing or too old
    Idle         the condition is false
    Holding      true for less than `for`
    CoolingDown  it would fire, but it fired less than `cooldown` ago
    Fire         true for `for`, and out of its cooldown: act now

A Rule is level-triggered: while its condition stays true it fires again once each cooldown has passed (a leak
that someone "fixed" by opening the valve by hand is closed again); flapping within the cooldown fires once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from corral.api.durations import seconds_of
from corral.api.rule import ACCEPTED_ANNOTATION, PREVIOUS_SPEC_ANNOTATION, Rule, RuleRevision, RuleSpec
from corral.decide.approvals import People
from corral.decide.evidence import Received
from corral.decide.interlocks import Compiled, compile_rule, evaluate, recent_readings
from corral.decide.interlocks import Rule as Condition
from corral.decide.revisions import previous_spec, restoring, spec_hash

Verdict = Literal["Invalid", "Stale", "Idle", "Holding", "CoolingDown", "Fire"]

# What `decide.interlocks` says when a key is missing from `devices` or `readings`: for a Rule, stale data.
_MISSING = ("too old", "has sent no reading", "there is no Device or reading", "no such key")
_NOT_EVALUABLE = " (not evaluable, so it forbids: "
# A timer set exactly at a boundary may wake a hair early; a little after it the comparison is settled.
SLACK_S = 0.05


@dataclass(frozen=True)
class InputFacts:
    """One input Device as the controller knows it now."""

    name: str
    exists: bool  # a Device of that name, bound to a device the controller has heard
    online: bool | None = None
    reported: Mapping[str, Any] | None = None
    latest: Mapping[str, Received] | None = None  # metric -> the newest sample, with its receive time


@dataclass(frozen=True)
class Memory:
    """What a Rule remembers between evaluations (its status says the same, so a restart agrees)."""

    true_since: datetime | None = None
    last_fired: datetime | None = None


@dataclass(frozen=True)
class Evaluation:
    """The verdict, in a sentence, the Rule's new memory, and when to evaluate again without any event."""

    verdict: Verdict
    message: str
    true_since: datetime | None
    look_again_s: float | None = None  # None: only an input's change can change the verdict
    stale: tuple[str, ...] = ()  # which inputs or readings were stale, for the InputsFresh condition


def compile_condition(name: str, spec: RuleSpec) -> Compiled:
    """Type-check the condition once per generation, exactly as an Interlock's."""
    return compile_rule(Condition(name=name, condition=spec.condition, message="",
                                  max_reading_age_s=float(spec.max_reading_age_seconds)))


def judge(compiled: Compiled, spec: RuleSpec, inputs: Mapping[str, InputFacts], memory: Memory,
          now: datetime) -> Evaluation:
    """Whether the Rule fires now; see the module's docstring for the order of the verdicts."""
    if not compiled.ok:
        return Evaluation("Invalid", f"The condition does not compile: {compiled.error}", None)
    stale = _stale_inputs(spec, inputs)
    if stale:
        return Evaluation("Stale", f"Not acting on old data: {'; '.join(stale)}.", None,
                          _next_expiry(spec, inputs, now), tuple(stale))
    devices, samples = _variables(spec, inputs)
    now_ms = now.timestamp() * 1000
    readings, too_old = recent_readings(samples, float(spec.max_reading_age_seconds), now_ms)
    verdict = evaluate(compiled, devices, readings, too_old)
    look_again = _next_expiry(spec, inputs, now)
    if not verdict.holds and verdict.message:
        why = verdict.message.removeprefix(_NOT_EVALUABLE).removesuffix(")")
        if any(phrase in why for phrase in _MISSING):
            return Evaluation("Stale", f"Not acting on old data: {why}.", None, look_again, (why,))
        return Evaluation("Invalid", f"The condition could not be evaluated: {why}.", None, look_again)
    if not verdict.holds:
        return Evaluation("Idle", "The condition is false.", None, look_again)
    since = memory.true_since or now
    held_s = (now - since).total_seconds()
    for_s = seconds_of(spec.for_)
    if held_s < for_s:
        return Evaluation("Holding", f"The condition has held for {held_s:.1f} s of the {for_s:g} s it must.", since,
                          _earliest(for_s - held_s + SLACK_S, look_again))
    if memory.last_fired is not None:
        cooldown_s = seconds_of(spec.cooldown)
        left_s = (memory.last_fired + timedelta(seconds=cooldown_s) - now).total_seconds()
        if left_s > 0:
            return Evaluation("CoolingDown", f"The condition holds, but the Rule fired at "
                                             f"{memory.last_fired:%Y-%m-%d %H:%M:%S} UTC and its cooldown of "
                                             f"{cooldown_s:g} s has {left_s:.1f} s left.", since,
                              _earliest(left_s + SLACK_S, look_again))
    return Evaluation("Fire", f"The condition has held for {held_s:.1f} s (for: {spec.for_}).", since, look_again)


def accepted(rule: Rule, people: People) -> bool:
    """Whether this revision may act: a person wrote it, or a person accepted exactly this generation."""
    if people.includes(rule.spec.author):
        return True
    mark = (rule.metadata.annotations or {}).get(ACCEPTED_ANNOTATION, "")
    generation, _, username = mark.partition(":")
    return generation == str(rule.metadata.generation) and people.includes(username)


def recorded_as(rule: Rule, spec: RuleSpec) -> RuleRevision | None:
    """The newest revision of this Rule the controller recorded (rule.revised, listed in its status) whose spec is
    exactly `spec`; None when no record has it. Annotations are whatever their last writer put there: a revision
    is a fact only once the controller saw it as the Rule's spec."""
    wanted = spec_hash(spec)
    return next((r for r in (rule.status.revisions if rule.status else []) if r.spec_hash == wanted), None)


def current_on_record(rule: Rule) -> RuleRevision:
    """The record of the Rule's current revision, which an acceptance accepts; ValueError saying why there is none."""
    generation, found = rule.metadata.generation, recorded_as(rule, rule.spec)
    if found is None or found.generation != generation:
        raise ValueError(f"revision {generation} of Rule {rule.metadata.name} is not on record yet: the controller "
                         "writes a rule.revised record of every revision it sees and lists it in status.revisions. "
                         "Nothing was done; try again in a moment (is the controller running?)")
    return found


@dataclass(frozen=True)
class Restore:
    """A restore as it will be written: the kept revision as the restorer's (`spec`), the annotation that keeps the
    replaced one (`kept`), and the record of the revision it restores (`revision`)."""

    spec: RuleSpec
    kept: str
    revision: RuleRevision
    restored: RuleSpec  # the kept revision as it was recorded (its own author)


def restore_plan(rule: Rule, author: str, groups: Sequence[str] = ()) -> Restore:
    """What restoring the kept previous revision writes; ValueError, saying why, when there is nothing to restore
    or the kept revision matches no revision the controller recorded (written into the annotation, never the
    Rule's spec: restoring it would run a spec nobody saw act)."""
    annotations = rule.metadata.annotations
    spec, kept = restoring(rule.spec, annotations, author, groups)
    restored = previous_spec(annotations)
    revision = recorded_as(rule, restored) if restored is not None else None
    if restored is None or revision is None:
        raise ValueError(f"the kept previous revision (annotation {PREVIOUS_SPEC_ANNOTATION}, sha256 "
                         f"{spec_hash(restored)[:12] if restored else '?'}) matches no revision the controller "
                         "recorded for this Rule (rule.revised, status.revisions): it was written into the annotation, "
                         "or the controller never saw it as the Rule's spec. Nothing was restored; write the spec you "
                         "want yourself after reading it")
    return Restore(spec, kept, revision, restored)


def agent_written(rule: Rule, people: People) -> bool:
    """A revision not written by a person: it obeys the agents' pause too, and acts only once accepted."""
    return not people.includes(rule.spec.author)


def _stale_inputs(spec: RuleSpec, inputs: Mapping[str, InputFacts]) -> list[str]:
    stale = []
    for name in spec.inputs:
        facts = inputs.get(name)
        if facts is None or not facts.exists:
            stale.append(f"input {name} is missing (no such Device, or its device has not been heard)")
        elif not facts.online:
            stale.append(f"input {name} is offline")
    return stale


def _variables(spec: RuleSpec, inputs: Mapping[str, InputFacts]
               ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Received]]]:
    devices: dict[str, dict[str, Any]] = {}
    samples: dict[str, dict[str, Received]] = {}
    for name in spec.inputs:
        facts = inputs[name]
        devices[name] = {"reported": dict(facts.reported or {}), "online": bool(facts.online)}
        if facts.latest:
            samples[name] = dict(facts.latest)
    return devices, samples


def _next_expiry(spec: RuleSpec, inputs: Mapping[str, InputFacts], now: datetime) -> float | None:
    """When the first reading still fresh grows too old: the condition may change then without any message."""
    limit_ms, now_ms = spec.max_reading_age_seconds * 1000, now.timestamp() * 1000
    due = [sample.received_ms + limit_ms - now_ms for name in spec.inputs
           for sample in ((inputs[name].latest or {}).values() if name in inputs else ())]
    ahead = [ms for ms in due if ms >= 0]
    return min(ahead) / 1000 + SLACK_S if ahead else None


def _earliest(a: float, b: float | None) -> float:
    return a if b is None else min(a, b)

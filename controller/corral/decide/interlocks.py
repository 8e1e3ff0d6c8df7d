"""Interlocks, judged: which rules guard an action, and whether each holds now. Pure, no I/O.

A rule is a CEL condition (the cel-expr-python binding of CEL's C++ runtime) over two variables, both
limited to the Interlock's namespace:

    devices   Device name -> {"reported": actuator id -> value, "online": bool}
    readings  Device name -> metric -> latest value, only readings younger than the rule's maximum age
              (by when the controller received them); a Device without such a reading is not a key

A condition that does not compile forbids everything it guards; so does one whose evaluation fails (a
missing Device, a missing or too old reading: "no such key"), gives anything but a boolean, or exceeds
the cost bound. Cost is bounded three ways: the length of the condition (the CRD caps it), the runtime's
own limits (parser recursion depth, 10,000 comprehension iterations per evaluation), and a time limit
measured around each evaluation, beyond which the verdict is "could not be evaluated". The runtime holds
the GIL and cannot be interrupted, so the time limit judges an evaluation afterwards; the iteration budget
is what keeps it short.

The verdicts are `decision.InterlockVerdict`s: `decide()` denies with DENY_INTERLOCK when one does not hold.

A rule whose selector names a key of Corral's own label domain (corral.dev/location, which an agent may change,
the shard, ...; admission refuses it, so only one stored before that rule has it) cannot say which Devices it was
meant for: it fails closed. It guards every Device of its namespace (for its actuators and values) and forbids
without evaluating its condition, naming the label, until a person rewrites its selector (`selector_refused`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext.ext_math import ExtMath
from cel_expr_python.ext.ext_optional import ExtOptional
from cel_expr_python.ext.ext_strings import ExtStrings

from corral.api.labels import refusal
from corral.contract.values import same_value
from corral.decide.decision import InterlockVerdict
from corral.decide.evidence import Received
from corral.decide.selectors import Selector

# An evaluation that takes longer than this is not trusted to have been meant: it forbids.
EVALUATION_TIME_LIMIT_S = 0.1
ITERATION_BUDGET = 10_000  # cel-cpp's default comprehension budget, per evaluation
MESSAGE_LIMIT = 900

@dataclass(frozen=True)
class Rule:
    """One Interlock's spec, as the judge needs it."""

    name: str
    condition: str
    message: str
    devices: tuple[str, ...] = ()
    selector: Selector | None = None
    actuators: tuple[str, ...] = ()  # empty: every actuator
    values: tuple[object, ...] = ()  # empty: every value
    max_reading_age_s: float = 60.0


@dataclass(frozen=True)
class Compiled:
    """A rule and its compiled condition, or why it did not compile."""

    rule: Rule
    program: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@cache
def _environment() -> Any:
    dyn = cel.Type.DYN
    return cel.NewEnv(
        variables={"devices": cel.Type.Map(cel.Type.STRING, dyn),
                   "readings": cel.Type.Map(cel.Type.STRING, cel.Type.Map(cel.Type.STRING, dyn))},
        extensions=[ExtStrings(), ExtMath(), ExtOptional()],
    )


def compile_rule(rule: Rule) -> Compiled:
    """Type-check the condition once: a syntax error, an unknown name or a non-boolean result is refused here."""
    try:
        program = _environment().compile(rule.condition)
    except RuntimeError as err:
        return Compiled(rule, error=_compiler_message(str(err)))
    kind = program.return_type()
    if kind != cel.Type.BOOL and kind != cel.Type.DYN:
        return Compiled(rule, error=f"the condition gives {kind.name().lower()}, not a boolean")
    return Compiled(rule, program)


def applies(rule: Rule, device: str, labels: Mapping[str, str], actuator: str, value: object) -> bool:
    """Whether the rule guards setting `actuator` of Device `device` to `value`."""
    if not guards_device(rule, device, labels) or (rule.actuators and actuator not in rule.actuators):
        return False
    return not rule.values or any(same_value(value, v) for v in rule.values)


def guards_device(rule: Rule, device: str, labels: Mapping[str, str]) -> bool:
    """Whether the rule guards any action on the Device: every Device, when its selector cannot be trusted."""
    if device in rule.devices or selector_refused(rule) is not None:
        return True
    return rule.selector is not None and rule.selector.matches(labels)


def selector_refused(rule: Rule) -> str | None:
    """Why the rule's selector cannot say what it guards (a key Corral derives, an agent may move); None if it can."""
    found = rule.selector.derived_keys() if rule.selector is not None else []
    if not found:
        return None
    return (f"its selector key {refusal(found[0])}. Until a person rewrites the selector, it guards every Device "
            "of its namespace and forbids whatever it guards there, whatever its condition says")


def recent_readings(samples: Mapping[str, Mapping[str, Received]], max_age_s: float, now_ms: float
                    ) -> tuple[dict[str, dict[str, object]], dict[str, dict[str, float]]]:
    """The `readings` variable: values younger than max_age_s. And the ages (s) of those left out as too old."""
    readings: dict[str, dict[str, object]] = {}
    too_old: dict[str, dict[str, float]] = {}
    for device, metrics in samples.items():
        for metric, sample in metrics.items():
            age_s = (now_ms - sample.received_ms) / 1000
            if age_s <= max_age_s:
                readings.setdefault(device, {})[metric] = sample.value
            else:
                too_old.setdefault(device, {})[metric] = age_s
    return readings, too_old


def evaluate(compiled: Compiled, devices: Mapping[str, Mapping[str, Any]], readings: Mapping[str, Mapping[str, Any]],
             too_old: Mapping[str, Mapping[str, float]] | None = None, *,
             time_limit_s: float = EVALUATION_TIME_LIMIT_S, timer: Callable[[], float] = time.perf_counter
             ) -> InterlockVerdict:
    """Whether the rule holds for this state of the namespace; anything but a plain true forbids."""
    rule = compiled.rule
    refused = selector_refused(rule)
    if refused is not None:
        return InterlockVerdict(rule.name, False, f"{rule.message} ({refused})"[:MESSAGE_LIMIT])
    if not compiled.ok:
        return _forbids(rule, f"its condition does not compile: {compiled.error}")
    started = timer()
    try:
        result = compiled.program.eval(data={"devices": dict(devices), "readings": dict(readings)})
    except (RuntimeError, TypeError, ValueError) as err:  # the runtime's own limits; a value it cannot take
        return _forbids(rule, _runtime_message(str(err)))
    elapsed = timer() - started
    if elapsed > time_limit_s:
        return _forbids(rule, f"its evaluation took {elapsed * 1000:.0f} ms, more than the "
                              f"{time_limit_s * 1000:.0f} ms allowed")
    kind = result.type()
    if kind == cel.Type.ERROR:
        return _forbids(rule, _error_message(str(result.plain_value()), rule, devices, readings, too_old or {}))
    if kind != cel.Type.BOOL:
        return _forbids(rule, f"its condition gave {kind.name().lower()}, not a boolean")
    return InterlockVerdict(rule.name, bool(result.plain_value()), rule.message)


def _forbids(rule: Rule, why: str) -> InterlockVerdict:
    return InterlockVerdict(rule.name, False, f"{rule.message} (not evaluable, so it forbids: {why})"[:MESSAGE_LIMIT])


_NOT_FOUND = re.compile(r'Key not found in map\s*:\s*"?(?P<key>[^"]*)"?')


def _error_message(error: str, rule: Rule, devices: Mapping[str, Mapping[str, Any]],
                   readings: Mapping[str, Mapping[str, Any]], too_old: Mapping[str, Mapping[str, float]]) -> str:
    found = _NOT_FOUND.search(error)
    if found is None:
        return _runtime_message(error)
    key, limit = found["key"], f"{rule.max_reading_age_s:g} s"
    if key in too_old and key not in readings:
        newest = min(too_old[key].values())
        return f"the readings of {key} are too old (the newest is {newest:.1f} s old; the rule allows {limit})"
    old = [(device, ages[key]) for device, ages in sorted(too_old.items()) if key in ages]
    if old:
        device, age = old[0]
        return f"the reading {device}/{key} is too old ({age:.1f} s; the rule allows {limit})"
    if key in devices and key not in readings:
        return f"Device {key} has sent no reading in the last {limit}"
    if not any(key in metrics for metrics in readings.values()) and key not in devices:
        return f"there is no Device or reading {json.dumps(key)} (a missing Device, or a reading missing or " \
               f"older than {limit})"
    return f"no such key {json.dumps(key)}"


def _compiler_message(text: str) -> str:
    """cel-cpp's message without its status prefix and the source echo under it: one line, with the position."""
    first = text.split("\n", 1)[0].strip()
    first = re.sub(r"^[A-Z_]+:\s*", "", first)
    first = re.sub(r"\s*\[[A-Z_]+\]$", "", first)
    first = re.sub(r"^ERROR: <input>:(\d+):(\d+):\s*", r"line \1, column \2: ", first)
    first = re.sub(r"\\u([0-9A-Fa-f]{4})", lambda m: chr(int(m[1], 16)), first)  # cel-cpp escapes '?' so
    return first[:MESSAGE_LIMIT] or "the condition does not compile"


def _runtime_message(text: str) -> str:
    message = _compiler_message(text)
    if "budget" in message.lower():
        return f"it exceeds the evaluation budget ({ITERATION_BUDGET:,} comprehension iterations)"
    return message

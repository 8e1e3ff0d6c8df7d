"""The Interlocks of the watched namespaces: kept by an informer, compiled once per generation, judged on demand.

The Intent reconciler asks for `verdicts()` when it decides an Intent and again right before it runs one; the
device reconciler asks before it drives a target, and lists `guarding()` rules in the Device's status. Both get
what the pure `decide.interlocks` says over the namespace's Devices as the controller knows them now: their
reported state, whether they are online, and their latest readings by when the controller received them.

Whether a condition compiled is the Interlock's status condition `Compiled`, written (server-side apply, status
subresource) only when it changed. Interlocks are read as `api.interlock.Interlock` models where they enter
(kube.watched); one the model refuses guards nothing Corral can name, and its Compiled condition says why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidatorFunctionWrapHandler, field_validator

from corral.api.base import ObjectMeta
from corral.api.codes import GROUP, VERSION
from corral.api.device import Device
from corral.api.interlock import Interlock, InterlockStatus, LabelSelector
from corral.api.labels import READ_STORED
from corral.decide.decision import InterlockVerdict
from corral.decide.evidence import Received
from corral.decide.interlocks import (
    Compiled,
    Rule,
    applies,
    compile_rule,
    evaluate,
    guards_device,
    recent_readings,
    selector_refused,
)
from corral.decide.selectors import Requirement, Selector
from corral.devices.telemetry import Reading
from corral.kube.cache import Key, TypedChange
from corral.kube.conditions import Wanted, merge
from corral.kube.objects import Kube
from corral.kube.typed import Body, Malformed, parse
from corral.kube.watched import Refused, WatchedKind, generation_changed
from corral.kube.workqueue import Result

log = logging.getLogger(__name__)

COMPILED = "Compiled"
SELECTOR_ACCEPTED = "SelectorAccepted"


class DeviceState(Protocol):
    """What a rule's `devices` and `readings` are made of, for one Device (the device port's DeviceView is one)."""

    @property
    def reported(self) -> Mapping[str, Any]: ...

    @property
    def online(self) -> bool | None: ...

    @property
    def latest(self) -> Mapping[str, Reading]: ...


class KnownDevices(Protocol):
    """The Devices the controller knows, by (namespace, name)."""

    def items(self) -> Sequence[tuple[Key, object]]: ...


ViewOf = Callable[[str, str], DeviceState | None]


class _Readable(Interlock):
    """An Interlock as the controller reads it: a status it cannot read is no status (it is written anew), and a
    selector on a label Corral derives, which admission refuses now, is read as stored (one from before that rule),
    so that the rule fails closed on it instead of guarding nothing (decide.interlocks.selector_refused)."""

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Self:
        return super().model_validate(obj, **{**kwargs, "context": READ_STORED})

    @field_validator("status", mode="wrap")
    @classmethod
    def _unreadable_status_is_none(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> InterlockStatus | None:
        try:
            status: InterlockStatus | None = handler(value)
        except ValidationError:
            return None
        return status


class _Named(BaseModel):
    """A Device body read for its name and labels only."""

    model_config = ConfigDict(extra="ignore")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)


class Interlocks(WatchedKind[_Readable]):
    def __init__(self, kube: Kube, devices: KnownDevices, namespaces: tuple[str, ...],
                 on_change: Callable[[str], None] = lambda namespace: None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(kube.api, _Readable, GROUP, VERSION, "interlocks", namespaces)
        self.kube = kube
        self.devices = devices
        self.on_change = on_change  # the namespace whose rules changed: its Devices list them in status
        self.clock = clock  # epoch seconds, the clock readings are stamped with when they arrive
        self.rules: dict[str, dict[str, Compiled]] = {}  # namespace -> name -> compiled rule

    # ---- the Interlocks -------------------------------------------------------------------------------------

    def changed(self, change: TypedChange[_Readable]) -> None:
        namespace, name = change.key
        if generation_changed(change) or name not in self.rules.get(namespace, {}):
            self.rules.setdefault(namespace, {})[name] = compiled = compile_rule(rule_of(change.after))
            if compiled.error is not None:
                log.warning("Interlock %s/%s does not compile: %s", namespace, name, compiled.error)
            if (refused := selector_refused(compiled.rule)) is not None:
                log.warning("Interlock %s/%s fails closed: %s", namespace, name, refused)
            self.on_change(namespace)
        self.queue.add(change.key)

    def refused_one(self, key: Key, refused: Refused) -> None:
        # The API server checked the schema; what does not parse here guards nothing Corral can name.
        namespace, name = key
        self.rules.setdefault(namespace, {})[name] = Compiled(
            Rule(name=name, condition="", message=""),
            error=f"the Interlock does not parse: {'; '.join(refused.error.problems)}")
        self.on_change(namespace)
        self.queue.add(key)

    def deleted(self, key: Key, before: _Readable | None, uid: str | None) -> None:
        namespace, name = key
        if self.rules.get(namespace, {}).pop(name, None) is not None:
            self.on_change(namespace)

    async def reconcile(self, key: Key) -> Result:
        """Write the Compiled condition, if the status does not say it already."""
        obj, refused = self.objects.get(key), self.refused.get(key)
        compiled = self.rules.get(key[0], {}).get(key[1])
        if compiled is None or (obj is None and refused is None):
            return Result.done()
        if obj is not None:
            generation, previous = obj.metadata.generation, obj.status or InterlockStatus()
        else:
            assert refused is not None
            generation, previous = refused.generation, _status_of(refused)
        conditions = merge(previous.conditions, _wanted(compiled, generation, parsed=obj is not None),
                           datetime.now(UTC).replace(microsecond=0))
        status = InterlockStatus(conditions=conditions, observed_generation=generation)
        if _same_status(status, previous):
            return Result.done()
        written = await self.kube.apply_status("interlocks", key[0], key[1], "Interlock",
                                               status.model_dump(mode="json", by_alias=True, exclude_none=True),
                                               "interlock-compiled")
        try:
            self.objects.upsert(written)
        except Malformed:
            pass  # still refused: the condition says why
        return Result.done()

    # ---- judging --------------------------------------------------------------------------------------------

    def guarding(self, namespace: str, device: Device | Body) -> list[Compiled]:
        """The rules that guard some action on this Device, by name."""
        name, labels = _name_and_labels(device)
        rules = self.rules.get(namespace, {})
        return [rules[n] for n in sorted(rules) if guards_device(rules[n].rule, name, labels)]

    def verdicts(self, namespace: str, device: Device | Body, actuator: str, value: Any, view_of: ViewOf
                 ) -> tuple[InterlockVerdict, ...]:
        """Every rule that guards setting `actuator` of this Device to `value`, judged now, by name."""
        name, labels = _name_and_labels(device)
        rules = self.rules.get(namespace, {})
        guarding = [rules[n] for n in sorted(rules) if applies(rules[n].rule, name, labels, actuator, value)]
        if not guarding:
            return ()
        devices, samples = self._namespace_now(namespace, view_of)
        now_ms = self.clock() * 1000
        verdicts = []
        for compiled in guarding:
            readings, too_old = recent_readings(samples, compiled.rule.max_reading_age_s, now_ms)
            verdicts.append(evaluate(compiled, devices, readings, too_old))
        return tuple(verdicts)

    def _namespace_now(self, namespace: str, view_of: ViewOf
                       ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Received]]]:
        """The `devices` variable and every latest reading of the namespace's Devices."""
        devices: dict[str, dict[str, Any]] = {}
        samples: dict[str, dict[str, Received]] = {}
        for (ns, name), _device in self.devices.items():
            if ns != namespace:
                continue
            view = view_of(ns, name)
            if view is None:
                continue
            devices[name] = {"reported": dict(view.reported), "online": bool(view.online)}
            if view.latest:
                samples[name] = {metric: Received(sample.ts, sample.received_ms, sample.value)
                                 for metric, sample in view.latest.items()}
        return devices, samples


def rule_of(interlock: Interlock | Body) -> Rule:
    """The Interlock as the judge needs it; `Malformed` if a body does not parse."""
    obj = interlock if isinstance(interlock, Interlock) else parse(_Readable, interlock)
    spec, guards = obj.spec, obj.spec.guards
    return Rule(name=obj.metadata.name or "", condition=spec.condition, message=spec.message,
                devices=tuple(guards.devices), selector=selector_of(guards.selector), actuators=tuple(guards.actuators),
                values=tuple(guards.values), max_reading_age_s=float(spec.max_reading_age_seconds))


def _wanted(compiled: Compiled, generation: int | None, parsed: bool) -> list[Wanted]:
    """Compiled, and (for an Interlock that parses) SelectorAccepted: False when its selector names a label Corral
    derives, so that it fails closed (one stored before admission refused such selectors)."""
    wanted = [Wanted(COMPILED, "True", "Compiled", "The condition compiled to a boolean expression.", generation)
              if compiled.ok else Wanted(COMPILED, "False", "CompileError", compiled.error or "", generation)]
    if not parsed:
        return wanted
    refused = selector_refused(compiled.rule)
    wanted.append(Wanted(SELECTOR_ACCEPTED, "True", "NoDerivedLabels",
                         "Its selector names no label of the corral.dev/ domain.", generation) if refused is None else
                  Wanted(SELECTOR_ACCEPTED, "False", "DerivedLabel", f"It fails closed: {refused}.", generation))
    return wanted


def _name_and_labels(device: Device | Body) -> tuple[str, Mapping[str, str]]:
    meta = device.metadata if isinstance(device, Device) else _Named.model_validate(device).metadata
    return meta.name or "", meta.labels or {}


def _status_of(refused: Refused) -> InterlockStatus:
    """What the status of an Interlock its model refused says already (nothing, if it cannot be read either)."""
    try:
        return InterlockStatus.model_validate(refused.status or {})
    except ValidationError:
        return InterlockStatus()


def selector_of(selector: LabelSelector | None) -> Selector | None:
    if selector is None:
        return None
    return Selector(dict(selector.match_labels or {}),
                    tuple(Requirement(r.key, r.operator, tuple(r.values)) for r in selector.match_expressions or []))


def _same_status(status: InterlockStatus, previous: InterlockStatus) -> bool:
    return status.model_dump() == previous.model_dump()

"""The Interlocks of the watched namespaces: kept by an informer, compiled once per generation, judged on demand.

The Intent reconciler asks for `verdicts()` when it decides an Intent and again right before it runs one; the
device reconciler asks before it drives a target, and lists `guarding()` rules in the Device's status. Both get
what the pure `decide.interlocks` says over the namespace's Devices as the controller knows them now: their
reported state, whether they are online, and their latest readings by when the controller received them.

Whether a condition compiled is the Interlock's status condition `Compiled`, written (server-side apply, status
subresource) only when it changed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from corral.api.codes import GROUP, VERSION
from corral.api.interlock import Interlock, InterlockStatus, LabelSelector
from corral.decide.decision import InterlockVerdict, Received
from corral.decide.interlocks import (
    Compiled,
    Rule,
    applies,
    compile_rule,
    evaluate,
    guards_device,
    recent_readings,
)
from corral.decide.selectors import Requirement, Selector
from corral.kube.cache import Body, Key, key_of
from corral.kube.conditions import Wanted, merge
from corral.kube.informer import WatchedKind
from corral.kube.objects import Kube
from corral.kube.workqueue import Result
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.port import DeviceView

log = logging.getLogger(__name__)

ViewOf = Callable[[str, str], DeviceView | None]
COMPILED = "Compiled"


class Interlocks(WatchedKind):
    def __init__(self, kube: Kube, devices: DeviceCache, namespaces: tuple[str, ...],
                 on_change: Callable[[str], None] = lambda namespace: None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(kube.api, GROUP, VERSION, "interlocks", namespaces)
        self.kube = kube
        self.devices = devices
        self.on_change = on_change  # the namespace whose rules changed: its Devices list them in status
        self.clock = clock  # epoch seconds, the clock readings are stamped with when they arrive
        self.rules: dict[str, dict[str, Compiled]] = {}  # namespace -> name -> compiled rule

    # ---- the Interlocks -------------------------------------------------------------------------------------

    def on_event(self, event_type: str, body: Body) -> None:
        namespace, name = key_of(body)
        if event_type == "DELETED":
            self.objects.remove(body)
            if self.rules.get(namespace, {}).pop(name, None) is not None:
                self.on_change(namespace)
            return
        change = self.objects.upsert(body)
        if change is None:
            return
        if change.generation_changed or name not in self.rules.get(namespace, {}):
            self.rules.setdefault(namespace, {})[name] = compiled = _compile(body)
            if compiled.error is not None:
                log.warning("Interlock %s/%s does not compile: %s", namespace, name, compiled.error)
            self.on_change(namespace)
        self.queue.add(change.key)

    async def reconcile(self, key: Key) -> Result:
        """Write the Compiled condition, if the status does not say it already."""
        body = self.objects.get(key)
        compiled = self.rules.get(key[0], {}).get(key[1])
        if body is None or compiled is None:
            return Result.done()
        generation = body["metadata"].get("generation")
        try:
            previous = InterlockStatus.model_validate(body.get("status") or {})
        except ValidationError:
            previous = InterlockStatus()
        wanted = (Wanted(COMPILED, "True", "Compiled", "The condition compiled to a boolean expression.", generation)
                  if compiled.ok else Wanted(COMPILED, "False", "CompileError", compiled.error or "", generation))
        conditions = merge(previous.conditions, [wanted], datetime.now(UTC).replace(microsecond=0))
        status = InterlockStatus(conditions=conditions, observed_generation=generation)
        if _same_status(status, previous):
            return Result.done()
        written = await self.kube.apply_status("interlocks", key[0], key[1], "Interlock",
                                               status.model_dump(mode="json", by_alias=True, exclude_none=True),
                                               "interlock-compiled")
        self.objects.upsert(written)
        return Result.done()

    # ---- judging --------------------------------------------------------------------------------------------

    def guarding(self, namespace: str, device: Body) -> list[Compiled]:
        """The rules that guard some action on this Device, by name."""
        name, labels = device["metadata"]["name"], device["metadata"].get("labels") or {}
        rules = self.rules.get(namespace, {})
        return [rules[n] for n in sorted(rules) if guards_device(rules[n].rule, name, labels)]

    def verdicts(self, namespace: str, device: Body, actuator: str, value: Any, view_of: ViewOf
                 ) -> tuple[InterlockVerdict, ...]:
        """Every rule that guards setting `actuator` of this Device to `value`, judged now, by name."""
        name, labels = device["metadata"]["name"], device["metadata"].get("labels") or {}
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
        for (ns, name), _body in self.devices.items():
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


def rule_of(body: Body) -> Rule:
    """The Interlock as the judge needs it; ValidationError if it does not parse."""
    spec = Interlock.model_validate(body).spec
    guards = spec.guards
    return Rule(name=body["metadata"]["name"], condition=spec.condition, message=spec.message,
                devices=tuple(guards.devices), selector=selector_of(guards.selector), actuators=tuple(guards.actuators),
                values=tuple(guards.values), max_reading_age_s=float(spec.max_reading_age_seconds))


def _compile(body: Body) -> Compiled:
    try:
        rule = rule_of(body)
    except ValidationError as err:
        # The API server checked the schema; what does not parse here guards nothing Corral can name.
        spec = body.get("spec") or {}
        rule = Rule(name=body["metadata"]["name"], condition=str(spec.get("condition", "")),
                    message=str(spec.get("message", "")))
        return Compiled(rule, error=f"the Interlock does not parse: {err.errors()[0]['msg'] if err.errors() else err}")
    return compile_rule(rule)


def selector_of(selector: LabelSelector | None) -> Selector | None:
    if selector is None:
        return None
    return Selector(dict(selector.match_labels or {}),
                    tuple(Requirement(r.key, r.operator, tuple(r.values)) for r in selector.match_expressions or []))


def _same_status(status: InterlockStatus, previous: InterlockStatus) -> bool:
    return status.model_dump() == previous.model_dump()

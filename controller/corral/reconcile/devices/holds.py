"""What keeps a planned command from going out: an Interlock that forbids its target, a lease someone else holds.

A command for a target that an Interlock forbids is not sent, whoever set the target (a person's `kubectl apply`
above all: an executing Intent's own command was judged right before it, and goes out). The target is held, on
record in status (`interlockedTargets`, condition Interlocked), and stays held once the rule holds again: only a
changed target is driven (or an Intent that the interlocks allow). While the Device is leased, only the holder's
Intents are driven; a person's target waits for the lease to end (condition Leased).

Apart from the reconciler because both are the guards' word on a plan, and the same two steps run before and
after a command is sent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from corral.api.device import Device, GuardingInterlock, InterlockedTarget
from corral.contract.values import same_value
from corral.decide.decision import Lease
from corral.devices.plan import Command, Plan
from corral.reconcile.devices.driver import Pin
from corral.reconcile.devices.notices import DeviceNotices, as_json
from corral.reconcile.devices.runtime import DeviceRuntime
from corral.reconcile.devices.status import recorded

if TYPE_CHECKING:
    from corral.reconcile.guards.interlocks import Interlocks, ViewOf

Leased = Callable[[str, str], Lease | None]


class TargetHolds:
    def __init__(self, notices: DeviceNotices, interlocks: Interlocks | None, view_of: ViewOf | None,
                 leased: Leased | None) -> None:
        self.notices = notices
        self.interlocks = interlocks
        self.view_of = view_of  # the port's view of a Device, what interlock conditions are judged over
        self.leased = leased  # the Device's lease now, if any: while it lasts only its holder's Intents are driven

    def interlocked(self, rt: DeviceRuntime, device: Device, result: Plan, pins: list[Pin]
                    ) -> tuple[Plan, tuple[InterlockedTarget, ...]]:
        """The plan without the commands an interlock forbids (or forbade, for the same target), and those held."""
        if self.interlocks is None or self.view_of is None or not result.commands:
            return result, ()
        previous = recorded(device)
        held_before = {h.actuator: h for h in (previous.interlocked_targets or [])} if previous is not None else {}
        pinned = {p.command_id for p in pins}  # an executing Intent's: the interlocks judged it right before
        keep: list[Command] = []
        held: list[InterlockedTarget] = []
        for command in result.commands:
            before = held_before.get(command.actuator)
            if command.id in pinned:
                keep.append(command)
            elif before is not None and same_value(before.value, command.value):
                held.append(before)  # forbidden when it was set: not driven by itself, whatever the rule says now
            elif (forbidden := self._forbidden(rt, device, command)) is not None:
                held.append(forbidden)
            else:
                keep.append(command)
        if not held:
            return result, ()
        return dataclasses.replace(result, commands=keep), tuple(held)

    def _forbidden(self, rt: DeviceRuntime, device: Device, command: Command) -> InterlockedTarget | None:
        """The target held when an interlock forbids the command now (said once per generation and value)."""
        assert self.interlocks is not None and self.view_of is not None
        namespace, generation = device.metadata.namespace or "", device.metadata.generation
        forbidding = [v for v in self.interlocks.verdicts(namespace, device, command.actuator, command.value,
                                                          self.view_of) if not v.holds]
        if not forbidding:
            return None
        first = forbidding[0]
        shown = f"spec.target.{command.actuator}={as_json(command.value)}"
        self.notices.once(
            rt, device, f"interlocked/{generation}/{command.actuator}/{as_json(command.value)}", "Interlocked",
            "Hold", f"Not driving {shown}: Interlock {first.name} forbids it: {first.message}. It stays held "
                    "until the target changes, even once the rule holds again.", "Warning",
            fact=("target.interlocked", {"actuator": command.actuator, "value": command.value,
                                         "interlock": first.name, "message": first.message,
                                         "generation": generation}))
        return InterlockedTarget(actuator=command.actuator, value=command.value, interlock=first.name,
                                 message=first.message[:1024])

    def lease_held(self, device: Device, result: Plan, pins: list[Pin]) -> tuple[Plan, str | None]:
        """While the Device is leased, targets set by anyone but the holder's Intents (a person's kubectl apply) are
        not driven; they are once the lease ends. What is held, as the condition Leased says it."""
        name = device.metadata.name or ""
        lease = self.leased(device.metadata.namespace or "", name) if self.leased else None
        if lease is None or lease.expires_at <= datetime.now(UTC) or not result.commands:
            return result, None
        pinned = {p.command_id for p in pins}  # the holder's Intents: the lease was judged right before them
        held = [c for c in result.commands if c.id not in pinned]
        if not held:
            return result, None
        shown = ", ".join(f"spec.target.{c.actuator}={as_json(c.value)}" for c in held)
        message = (f"Not driving {shown}: Device {name} is leased to {lease.who()}"
                   + (f" ({lease.reason})" if lease.reason else "")
                   + f" until {lease.expires_at:%H:%M:%S} UTC unless renewed; it is driven when the lease ends "
                     "(or a person breaks it: corral lease break).")
        return dataclasses.replace(result, commands=[c for c in result.commands if c.id in pinned]), message

    def guarding(self, device: Device) -> tuple[GuardingInterlock, ...]:
        """The rules that guard the Device, as its status lists them."""
        if self.interlocks is None:
            return ()
        return tuple(GuardingInterlock(name=c.rule.name, actuators=list(c.rule.actuators), condition=c.rule.condition,
                                       message=c.rule.message, compiled=c.ok)
                     for c in self.interlocks.guarding(device.metadata.namespace or "", device)[:32])

"""What to send a device so that its reported state reaches the target: pure, no I/O.

Command ids for target changes are deterministic: `{device uid prefix}-g{generation}-e{epoch}-{actuator}`.
After a crash or a timeout the controller computes the same id again and the
firmware answers with its stored ack instead of executing twice. The epoch
grows only when the controller re-drives a device that drifted (someone
changed it by hand) and is written to status before the command goes out, so a
re-drive is never mistaken for the earlier command.

A command an executing Intent asked for is pinned: it goes out with the Intent's own id (made once and on
record with the Intent), even when the device already reports the value, because only the ack to that id
completes the Intent. A pin whose value the target no longer asks for was superseded and is not sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from corral.contract.model import Actuator, Contract
from corral.contract.values import InvalidValue, Value, check, same_value


@dataclass(frozen=True)
class Command:
    id: str
    actuator: str
    action: str
    value: Value

    def payload(self) -> dict[str, object]:
        return {"id": self.id, "cmd": self.action, "params": {"actuator": self.actuator, "value": self.value}}


@dataclass(frozen=True)
class PinnedCommand:
    """A command an executing Intent asked for, with the id it made for it."""

    actuator: str
    value: Any
    id: str


@dataclass(frozen=True)
class Plan:
    commands: list[Command] = field(default_factory=list)
    invalid: dict[str, str] = field(default_factory=dict)  # actuator -> why its target cannot be sent
    drifted: list[str] = field(default_factory=list)  # actuators changed on the device after they were driven
    bump_epoch: bool = False  # Enforce: write epoch + 1 to status, then plan again
    superseded: list[PinnedCommand] = field(default_factory=list)  # pins the target no longer asks for
    held: list[str] = field(default_factory=list)  # actuators left alone until an Intent's pin counts
    left: list[str] = field(default_factory=list)  # at a failsafe value, their target too old to drive again
    limited: list[str] = field(default_factory=list)  # switched off by their on-time limit: not switched on again

    @property
    def in_sync(self) -> bool:
        return (not self.commands and not self.invalid and not self.drifted and not self.bump_epoch and not self.held
                and not self.left and not self.limited)


def command_id(uid: str, generation: int, epoch: int, actuator: str) -> str:
    return f"{uid.replace('-', '')[:12]}-g{generation}-e{epoch}-{actuator}"


def plan(
    contract: Contract,
    target: dict[str, object],
    reported: dict[str, object],
    *,
    uid: str,
    generation: int,
    epoch: int,
    drift: Literal["Enforce", "Observe"],
    reached: frozenset[str] = frozenset(),
    pinned: Sequence[PinnedCommand] = (),
    held: frozenset[str] = frozenset(),
    leave: frozenset[str] = frozenset(),
    limited: frozenset[str] = frozenset(),
) -> Plan:
    """Commands for every targeted actuator whose reported value differs, and for every pinned command.

    `reached` names actuators that already reported their target at this
    generation and epoch: a difference there is drift, not a pending change.
    `held` names actuators an Intent is about to set (its command is pinned, its target not yet on the
    Device): nothing is sent for them until it is, so the Intent's command goes out with its own id.
    `leave` names actuators the firmware moved to their failsafe value whose target is too old to drive again
    by itself: nothing is sent for them (an Intent's pinned command still is).
    `limited` names actuators the firmware switched off by their on-time limit while their target is on: a
    re-drive would undo the limit, so nothing is sent for them either (an Intent's pinned command still is).
    """
    draft = _Draft()
    pins: dict[str, list[PinnedCommand]] = {}
    for pin in pinned:
        pins.setdefault(pin.actuator, []).append(pin)
    for actuator_id, wanted in sorted(target.items()):
        if actuator_id in held and actuator_id not in pins:
            draft.held.append(actuator_id)
            continue
        checked = _checked(contract, actuator_id, wanted)
        if isinstance(checked, str):
            draft.invalid[actuator_id] = checked
            continue
        actuator, value = checked
        asked = pins.pop(actuator_id, [])
        draft.superseded += [p for p in asked if not same_value(p.value, value)]
        matching = [p for p in asked if same_value(p.value, value)]
        if matching:
            draft.commands += [Command(p.id, actuator_id, actuator.action, value) for p in matching]
            continue
        if same_value(reported.get(actuator_id), value):
            continue
        if actuator_id in limited or actuator_id in leave:
            (draft.limited if actuator_id in limited else draft.left).append(actuator_id)
            continue
        if actuator_id in reached:
            draft.drifted.append(actuator_id)
            continue
        draft.commands.append(Command(command_id(uid, generation, epoch, actuator_id), actuator_id, actuator.action,
                                      value))
    for left in pins.values():
        draft.superseded += left  # their actuator is not targeted (or not valid) any more
    return draft.plan(drift)


def _checked(contract: Contract, actuator_id: str, wanted: object) -> tuple[Actuator, Value] | str:
    """The actuator and the target in its canonical type, or why the target cannot be sent."""
    actuator = contract.actuator(actuator_id)
    if actuator is None:
        known = ", ".join(a.id for a in contract.actuators) or "none"
        return f"the device has no actuator {actuator_id!r} (actuators: {known})"
    try:
        return actuator, check(actuator, wanted)
    except InvalidValue as err:
        return str(err)


@dataclass
class _Draft:
    """The plan as plan() draws it up, actuator by actuator."""

    commands: list[Command] = field(default_factory=list)
    invalid: dict[str, str] = field(default_factory=dict)
    drifted: list[str] = field(default_factory=list)
    superseded: list[PinnedCommand] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    limited: list[str] = field(default_factory=list)

    def plan(self, drift: Literal["Enforce", "Observe"]) -> Plan:
        if drift == "Enforce" and self.drifted:
            # Nothing is sent until the new epoch is on record; then the caller plans again.
            return Plan(invalid=self.invalid, drifted=self.drifted, bump_epoch=True, superseded=self.superseded,
                        held=self.held, left=self.left, limited=self.limited)
        return Plan(commands=self.commands, invalid=self.invalid, drifted=self.drifted, superseded=self.superseded,
                    held=self.held, left=self.left, limited=self.limited)

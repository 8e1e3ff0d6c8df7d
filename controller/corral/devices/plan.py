"""What to send a device so that its reported state reaches the target: pure, no I/O.

Command ids are deterministic: `{device uid prefix}-g{generation}-e{epoch}-{actuator}`.
After a crash or a timeout the controller computes the same id again and the
firmware answers with its stored ack instead of executing twice. The epoch
grows only when the controller re-drives a device that drifted (someone
changed it by hand) and is written to status before the command goes out, so a
re-drive is never mistaken for the earlier command.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from corral.contract.model import Contract
from corral.contract.values import InvalidValue, Value, check


@dataclass(frozen=True)
class Command:
    id: str
    actuator: str
    action: str
    value: Value

    def payload(self) -> dict[str, object]:
        return {"id": self.id, "cmd": self.action, "params": {"actuator": self.actuator, "value": self.value}}


@dataclass(frozen=True)
class Plan:
    commands: list[Command] = field(default_factory=list)
    invalid: dict[str, str] = field(default_factory=dict)  # actuator -> why its target cannot be sent
    drifted: list[str] = field(default_factory=list)  # actuators changed on the device after they were driven
    bump_epoch: bool = False  # Enforce: write epoch + 1 to status, then plan again

    @property
    def in_sync(self) -> bool:
        return not self.commands and not self.invalid and not self.drifted and not self.bump_epoch


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
) -> Plan:
    """Commands for every targeted actuator whose reported value differs.

    `reached` names actuators that already reported their target at this
    generation and epoch: a difference there is drift, not a pending change.
    """
    commands: list[Command] = []
    invalid: dict[str, str] = {}
    drifted: list[str] = []
    for actuator_id, wanted in sorted(target.items()):
        actuator = contract.actuator(actuator_id)
        if actuator is None:
            known = ", ".join(a.id for a in contract.actuators) or "none"
            invalid[actuator_id] = f"the device has no actuator {actuator_id!r} (actuators: {known})"
            continue
        try:
            value = check(actuator, wanted)
        except InvalidValue as err:
            invalid[actuator_id] = str(err)
            continue
        if same_value(reported.get(actuator_id), value):
            continue
        if actuator_id in reached:
            drifted.append(actuator_id)
            continue
        commands.append(Command(command_id(uid, generation, epoch, actuator_id), actuator_id, actuator.action, value))
    bump = drift == "Enforce" and bool(drifted)
    if bump:
        # Nothing is sent until the new epoch is on record; then the caller plans again.
        return Plan(invalid=invalid, drifted=drifted, bump_epoch=True)
    return Plan(commands=commands, invalid=invalid, drifted=drifted)


def same_value(reported: object, wanted: Value) -> bool:
    """Whether a reported value is the wanted one (1 is not True; 40 is 40.0)."""
    if isinstance(wanted, bool) or isinstance(reported, bool):
        return reported is wanted
    if isinstance(wanted, (int, float)) and isinstance(reported, (int, float)):
        return abs(float(reported) - float(wanted)) < 1e-9
    return reported == wanted

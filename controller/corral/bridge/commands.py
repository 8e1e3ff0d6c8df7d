"""Answering `iot/<id>/cmd` for one bridged device, as Corral's firmware does (docs/protocol.md): pure.

`Commands.receive` reads a command and says what to do: answer at once (a malformed command, a repeated id, a
stale epoch, `get_state`, a value the contract refuses, a value the device did not confirm and has not reported
since) or publish the device's payload once and wait for the confirmation (bridge/confirm.py). It keeps the bounded store of recent acks a repeated id is answered from, and the
highest epoch seen. No MQTT here: the runtime publishes what it is told.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from corral.contract.model import Actuator, Contract
from corral.contract.values import InvalidValue, Value, check, same_value, shown

# Recent command ids and their acks, per device (the firmware keeps a bounded number too).
REMEMBERED = 64


@dataclass(frozen=True)
class Answer:
    """Publish this ack now; nothing goes to the device."""

    ack: dict[str, Any]
    store: bool = True


@dataclass(frozen=True)
class Execute:
    """Publish the device's payload for actuator=value once, then ack on its confirmation (or its absence)."""

    id: str
    actuator: Actuator
    value: Value


class Commands:
    def __init__(self) -> None:
        self._acks: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._running: set[str] = set()
        # actuator -> (value, why): a value the device did not confirm, not published again until it reports a state
        self._unconfirmed: dict[str, tuple[Value, str]] = {}
        self.epoch = 0

    def not_confirmed(self, actuator: str, value: Value, error: str) -> None:
        """The device did not confirm actuator=value: another command for that value (the controller driving the
        same target again, with a new id) is answered at once and not published, so the device gets it once."""
        self._unconfirmed[actuator] = (value, error)

    def heard(self, actuator: str) -> None:
        """The device reported the actuator: it is there again, and a command for it is published again."""
        self._unconfirmed.pop(actuator, None)

    def receive(self, payload: bytes, contract: Contract | None, state: dict[str, Value]) -> Answer | Execute | None:
        """What to do with one `cmd` message; None when its id is running already (its ack will come). An answer
        to a well-formed command is remembered under its id."""
        what = self._receive(payload, contract, state)
        if isinstance(what, Answer) and what.store and what.ack["id"] is not None:
            self.remember(what.ack["id"], what.ack)
        return what

    def _receive(self, payload: bytes, contract: Contract | None, state: dict[str, Value]) -> Answer | Execute | None:
        try:
            command = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            return Answer(self._ack(None, False, "malformed command: not JSON", state), store=False)
        if not isinstance(command, dict):
            return Answer(self._ack(None, False, "malformed command: not a JSON object", state), store=False)
        command_id = command.get("id")
        if not isinstance(command_id, str) or not 1 <= len(command_id) <= 64:
            return Answer(self._ack(None, False, "malformed command: id must be a string of 1-64 characters", state),
                          store=False)
        epoch = command.get("epoch")
        if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0):
            return Answer(self._ack(command_id, False, "malformed command: epoch must be a whole number >= 0", state),
                          store=False)
        if command_id in self._acks:  # the stored ack first, whatever the epoch (docs/protocol.md, "Epoch")
            if epoch is not None:
                self.epoch = max(self.epoch, epoch)
            return Answer(self._acks[command_id], store=False)
        if command_id in self._running:
            return None
        if epoch is not None:
            if epoch < self.epoch:
                ack = self._ack(command_id, False, (
                    f"stale epoch {epoch}: this device has seen epoch {self.epoch} from the controller that now owns "
                    f"it; a command needs an epoch >= {self.epoch} (or none)"), state)
                ack["stale_epoch"] = {"sent": epoch, "seen": self.epoch}
                return Answer(ack, store=False)
            self.epoch = epoch
        kind = command.get("cmd")
        params = command.get("params") or {}
        if kind == "get_state":
            return Answer(self._ack(command_id, True, None, state))
        if contract is None:
            return Answer(self._ack(command_id, False, "the bridge has no contract for this device yet", state))
        if not isinstance(params, dict) or not isinstance(params.get("actuator"), str):
            return Answer(self._ack(command_id, False, "malformed command: params.actuator is missing", state))
        actuator = contract.actuator(params["actuator"])
        if actuator is None:
            known = ", ".join(a.id for a in contract.actuators) or "none"
            return Answer(self._ack(command_id, False,
                                    f"unknown actuator {shown(params['actuator'])}; actuators: {known}", state))
        if kind != actuator.action:
            return Answer(self._ack(command_id, False,
                                    f"{actuator.id} takes {actuator.action}, not {shown(kind)}", state))
        try:
            value = check(actuator, params.get("value"))
        except InvalidValue as err:
            # No firmware of ours clamps behind the bridge: a value outside the contract never reaches the device.
            return Answer(self._ack(command_id, False, str(err), state))
        unconfirmed = self._unconfirmed.get(actuator.id)
        if unconfirmed is not None and same_value(unconfirmed[0], value):
            return Answer(self._ack(command_id, False, (
                f"{unconfirmed[1]}; not published again: the device has reported no {actuator.id} since (the "
                "bridge publishes it again once the device reports a state)"), state))
        self._running.add(command_id)
        return Execute(command_id, actuator, value)

    def finish(self, command_id: str, ok: bool, error: str | None, state: dict[str, Value],
               note: str | None = None) -> dict[str, Any]:
        """The ack of an executed command, stored under its id."""
        self._running.discard(command_id)
        ack = self._ack(command_id, ok, error, state)
        if note:
            ack["note"] = note
        self.remember(command_id, ack)
        return ack

    def remember(self, command_id: str, ack: dict[str, Any]) -> None:
        self._acks[command_id] = ack
        self._acks.move_to_end(command_id)
        while len(self._acks) > REMEMBERED:
            self._acks.popitem(last=False)

    @staticmethod
    def _ack(command_id: str | None, ok: bool, error: str | None, state: dict[str, Value]) -> dict[str, Any]:
        return {"id": command_id, "ok": ok, "error": error, "state": dict(state)}

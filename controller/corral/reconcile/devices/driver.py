"""Commands to devices and what waits for their acks: the one place that publishes on `cmd` topics.

An executing Intent pins its command: the actuator, the value and the command id it made once and put on
record in the audit log (`intent.executing`). The device reconciler sends a pinned command with exactly that id (so a
restarted controller resends the same id and the firmware answers with its stored ack instead of running
it twice), and only the ack to that id completes the Intent. A pin counts once the target that asks for it
is on the Device (`applied`); a pin whose actuator's target then moves on to another value was superseded.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from corral.devices.commands import CommandTimeout, CommandTracker
from corral.devices.link import MqttLink
from corral.devices.messages import Ack
from corral.devices.plan import Command, PinnedCommand
from corral.devices.topics import Topics
from corral.obs import tracing
from corral.obs.crashpoints import ACK_RECEIVED, COMMAND_SENT, armed, crash_point
from corral.reconcile.doors import OPEN, Doors, NotOwned

State = dict[str, Any]


class DeviceRefused(Exception):
    """The device answered the command with an error (its ack's `error`)."""


class Superseded(Exception):
    """The Device's target for the actuator changed to another value before the command went out."""


class DeviceGone(Exception):
    """The device was revoked while its command waited for an ack: the broker refuses it, no ack can come."""


@dataclass(eq=False)
class Pin:
    device_id: str
    actuator: str
    value: Any
    command_id: str
    future: asyncio.Future[State]
    intent: str = ""  # namespace/name of the Intent that asked, for what people read
    trace: Context | None = None
    applied_generation: int | None = None  # the Device generation whose target asks for this value

    @property
    def command(self) -> PinnedCommand:
        return PinnedCommand(self.actuator, self.value, self.command_id)


@dataclass
class Expectations:
    """Pins by device id."""

    _pins: dict[str, list[Pin]] = field(default_factory=dict)

    def pin(self, device_id: str, actuator: str, value: Any, command_id: str, intent: str,
            trace: Context | None = None) -> Pin:
        """The pin for this command id, made now or earlier (a resumed Intent finds the one primed at start)."""
        for existing in self._pins.get(device_id, []):
            if existing.command_id == command_id:
                if trace is not None:
                    existing.trace = trace
                return existing
        future: asyncio.Future[State] = asyncio.get_running_loop().create_future()
        pin = Pin(device_id, actuator, value, command_id, future, intent, trace)
        self._pins.setdefault(device_id, []).append(pin)
        return pin

    def applied(self, device_id: str, generation: int) -> list[Pin]:
        """Pins whose target is on the Device, oldest first."""
        return [p for p in self._pins.get(device_id, []) if p.applied_generation is not None
                and p.applied_generation <= generation and not p.future.done()]

    def held(self, device_id: str, generation: int) -> frozenset[str]:
        """Actuators with a pin whose target is not on the Device (at this generation) yet: the device
        reconciler leaves them be until it is."""
        return frozenset(p.actuator for p in self._pins.get(device_id, []) if not p.future.done()
                         and (p.applied_generation is None or p.applied_generation > generation))

    def settle(self, device_id: str, ack: Ack, owned: bool = True) -> bool:
        """Complete the pin this ack answers; False when it answers none. `owned`: this replica still owns the
        device (a stale-epoch refusal means another replica took it over only when that is no longer so; a device
        that claims it while we own it is refusing, and the Intent fails with its words)."""
        for pin in self._pins.get(device_id, []):
            if pin.command_id == ack.id and not pin.future.done():
                crash_point(ACK_RECEIVED)
                if ack.ok:
                    pin.future.set_result(dict(ack.state))
                elif ack.stale_epoch is not None and not owned:
                    # Another replica holds the device's shard with a newer epoch: not a failure of the Intent,
                    # which its new owner carries on (this one records no decision for it).
                    pin.future.set_exception(NotOwned(
                        f"the device refused epoch {ack.stale_epoch.sent}: it has seen {ack.stale_epoch.seen} "
                        "from the replica that now owns it"))
                else:
                    pin.future.set_exception(DeviceRefused(ack.error or "refused without a reason"))
                return True
        return False

    def fail(self, pin: Pin, error: Exception) -> None:
        if not pin.future.done():
            pin.future.set_exception(error)

    def fail_device(self, device_id: str, error: Exception) -> None:
        """Fail every pin of the device that still waits (it was revoked)."""
        for pin in self._pins.get(device_id, []):
            self.fail(pin, error)

    def holds(self, pin: Pin) -> bool:
        """The pin is still held: the Intent that made it has not ended yet."""
        return pin in self._pins.get(pin.device_id, [])

    def release(self, pin: Pin) -> None:
        pins = self._pins.get(pin.device_id, [])
        if pin in pins:
            pins.remove(pin)
        if not pins:
            self._pins.pop(pin.device_id, None)
        if not pin.future.done():
            pin.future.cancel()
        elif not pin.future.cancelled():
            pin.future.exception()  # retrieved: nobody is left to read it

    def release_command(self, device_id: str, command_id: str) -> None:
        """Release the pin of this command, if one is held (an Intent that ended before it pinned again)."""
        for pin in list(self._pins.get(device_id, [])):
            if pin.command_id == command_id:
                self.release(pin)

    def __len__(self) -> int:
        return sum(len(pins) for pins in self._pins.values())


class Driver:
    def __init__(self, link: MqttLink, topics: Topics, command_timeout_s: float, doors: Doors = OPEN) -> None:
        self.link = link
        self.topics = topics
        self.command_timeout_s = command_timeout_s
        self.doors = doors  # asked right before each publish: a replica past its renew deadline sends nothing
        self.tracker = CommandTracker()
        self.expectations = Expectations()

    def on_ack(self, device_id: str, ack: Ack) -> None:
        """An ack from a device's own topic: to whoever waits for its id, and to the Intent that pinned it."""
        self.tracker.resolve(device_id, ack)
        self.expectations.settle(device_id, ack, self.doors.owns(device_id))

    async def send(self, device_id: str, command: Command, trace: Context | None = None, pinned: bool = False) -> Ack:
        """Publish the command and wait for its ack; CommandTimeout if none comes in time. `pinned`: an Intent's."""
        topic = self.topics.of(device_id, "cmd")

        def publish(payload: dict[str, Any]) -> None:
            sent = self.link.publish(topic, self._fenced(device_id, payload), trace=tracing.carrier())
            if pinned and armed(COMMAND_SENT):
                # Test-only: the crash is to come after the broker has the command, not while paho still queues it.
                sent.wait_for_publish(5.0)
                crash_point(COMMAND_SENT)

        with tracing.tracer().start_as_current_span(
                "corral.device.command", context=trace, kind=SpanKind.PRODUCER,
                attributes={"corral.device_id": device_id, "corral.command": command.id, "messaging.system": "mqtt"}):
            ack = await self.tracker.send(device_id, publish, command.payload(), self.command_timeout_s)
        self.expectations.settle(device_id, ack, self.doors.owns(device_id))
        return ack

    async def get_state(self, device_id: str, timeout_s: float | None = None) -> State:
        """Ask the device for its full state now (get_state changes nothing); CommandTimeout if it does not answer."""
        command = {"id": f"get-{uuid.uuid4().hex[:16]}", "cmd": "get_state", "params": {}}
        ack = await self.tracker.send(
            device_id, lambda payload: self.link.publish(self.topics.of(device_id, "cmd"),
                                                         self._fenced(device_id, payload)),
            command, self.command_timeout_s if timeout_s is None else timeout_s,
        )
        return dict(ack.state)

    def _fenced(self, device_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The door of every command: NotOwned unless this replica owns the device now; the payload carries the
        shard's epoch when there is one, so firmware that heard a later owner refuses this one (Fence 3)."""
        self.doors.check(device_id, "sending a command")
        epoch = self.doors.epoch(device_id)
        return payload if epoch is None else {**payload, "epoch": epoch}


__all__ = ["CommandTimeout", "DeviceGone", "DeviceRefused", "Driver", "Expectations", "Pin", "Superseded"]

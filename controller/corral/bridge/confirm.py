"""When a bridged device has done what a command asked: the confirmation rule, as a pure state machine.

Third-party devices send no ack. The bridge publishes a command's payload on the device's command topic once and
then waits for the device's own state to show the requested value. What counts (docs/bridge.md, "Commands and
outcomes"):

- only a state message that arrived *after* the publish (stamped on arrival, before it waited in any queue) and
  was not delivered as retained: a retained state is what the broker kept from before, never news;
- only from the source's own account: the broker's ACL lets nobody else publish on a bridged device's state topics
  (the bridge cannot see a publisher; the ACL is what makes this rule hold, reconcile/devices/accounts.py);
- a source that echoes commands optimistically (zigbee2mqtt's device option `optimistic`, on by default) publishes
  the requested value right after it sent the command, whatever the device did: that first matching message is
  taken for the echo and skipped, and only a further one (the device's own report) confirms;
- a state showing another value (a lock's `LOCKING`, a brightness on its way) is no answer yet: keep waiting.

When the timeout passes without a confirmation the command failed, unless the value requested was already the
device's last confirmed state: a device that is already there often publishes nothing (Home Assistant's own MQTT
devices only publish changes), so that case ends ok, saying the device reported the value already and did not echo.
The command is never published again either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from corral.contract.values import same_value, shown

# Beyond any reading of a value: an unknown previous state is not "equal" to anything.
UNKNOWN: object = object()


@dataclass(frozen=True)
class Confirmed:
    """The device showed the value: ack ok. `note` says how, when not by a fresh state (the equal-value case)."""

    value: object
    note: str | None = None


@dataclass(frozen=True)
class NotConfirmed:
    """The device did not show the value in time: ack ok false with `error`."""

    error: str


Outcome = Confirmed | NotConfirmed


def seconds(timeout_s: float) -> str:
    return str(int(timeout_s)) if float(timeout_s).is_integer() else f"{timeout_s:g}"


@dataclass
class Confirmation:
    """One command's wait: made when its payload is published (`published_at`, the same clock as the arrival
    stamps). Feed it the device's state readings with `on_state`; ask `on_timeout` once the deadline passed."""

    actuator: str
    wanted: object
    published_at: float
    timeout_s: float
    previous: object = UNKNOWN  # the last confirmed value of the actuator, UNKNOWN when none was ever seen
    echoes: int = 0  # matching messages to skip first: 1 where the source publishes an optimistic echo
    # Whether an observed value shows the wanted one (the codec's: a number within half its step).
    matches: Callable[[object, object], bool] = field(default=same_value)
    outcome: Outcome | None = None

    @property
    def deadline(self) -> float:
        return self.published_at + self.timeout_s

    def on_state(self, value: object, retained: bool, arrived_at: float) -> Outcome | None:
        """A reading of this actuator from the device's state topic; the outcome when it settles the command."""
        if self.outcome is not None:
            return None
        if retained or arrived_at < self.published_at or arrived_at > self.deadline:
            return None
        if not self.matches(value, self.wanted):
            return None
        if self.echoes > 0:
            self.echoes -= 1
            return None
        self.outcome = Confirmed(self.wanted)
        return self.outcome

    def on_timeout(self) -> Outcome:
        """The deadline passed without a confirmation (or settled before: that outcome stands)."""
        if self.outcome is not None:
            return self.outcome
        what = f"{self.actuator}={shown(self.wanted)}"
        if self.previous is not UNKNOWN and self.matches(self.previous, self.wanted):
            self.outcome = Confirmed(self.wanted, note=(
                f"the device reported {what} already and published no new state within {seconds(self.timeout_s)} s "
                "(devices often do not echo an unchanged value); the command was published once"))
        else:
            self.outcome = NotConfirmed(
                f"the device did not confirm {what} within {seconds(self.timeout_s)} s; "
                "the command was published once and not retried")
        return self.outcome

"""The controller's heartbeat: how device firmware knows the controller is there (the failsafe's clock). Pure.

One topic, `{prefix}/_corral/heartbeat` (`accounts.heartbeat_topic`; devices may read it, only the controller
may publish there), and four messages (docs/protocol.md, "Heartbeat and failsafe"):

- a **beat** every `interval_s`, not retained, QoS 0: `{"state": "alive", "seq": n, "ts": ms, "interval_ms": ms}`.
  Only beats count: firmware measures, on its own monotonic clock, the time since the last one it heard.
- on every connect, **retained** `{"state": "alive", "ts": ms}`: it replaces the Will left by an earlier death,
  so a device that boots later is not told of a loss that is over. It has no `seq`, so it never counts as a
  beat (a retained message may be old; a board's umqtt.simple cannot even tell that it is retained).
- the **Last Will**, retained: `{"state": "gone"}`: the broker publishes it when the controller's connection
  dies (a crash, a cut link, a hung process once its keep-alive runs out).
- on a clean stop, retained `{"state": "gone", "ts": ms}`: the broker drops the Will on a normal DISCONNECT.

`gone` names the cause; it does not move the clock, which already runs from the last beat. So a standby or
a second controller on the same prefix that dies cannot make devices fail safe while another one beats.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field

from corral.contract.model import Contract
from corral.devices.accounts import heartbeat_topic
from corral.devices.topics import Topics

DEFAULT_INTERVAL_S = 2.0
# A failsafe delay should span at least this many beats: one or two lost or late (a busy broker, Wi-Fi) must not
# set an actuator to its failsafe value while the controller is there.
BEATS_PER_FAILSAFE = 3
ALIVE = "alive"
GONE = "gone"


def _dumps(payload: dict[str, object]) -> str:
    return json.dumps(payload, separators=(",", ":"))


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Heartbeat:
    """The heartbeat of one controller on one prefix: its topic, its period and its beat counter."""

    topic: str
    interval_s: float = DEFAULT_INTERVAL_S
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1), repr=False)

    @classmethod
    def on(cls, topics: Topics, interval_s: float = DEFAULT_INTERVAL_S) -> Heartbeat:
        if not interval_s > 0:
            raise ValueError(f"the heartbeat interval must be positive, got {interval_s}")
        return cls(heartbeat_topic(topics), interval_s)

    def beat(self) -> str:
        """The next beat (not retained). `next()` on a count is atomic: paho's thread and the loop may both beat."""
        return _dumps({"state": ALIVE, "seq": next(self._seq), "ts": _now_ms(),
                       "interval_ms": int(self.interval_s * 1000)})

    @staticmethod
    def alive() -> str:
        """Retained on connect, replacing the Will."""
        return _dumps({"state": ALIVE, "ts": _now_ms()})

    @staticmethod
    def will() -> str:
        return _dumps({"state": GONE})

    @staticmethod
    def farewell() -> str:
        """Retained before a clean DISCONNECT (which discards the Will)."""
        return _dumps({"state": GONE, "ts": _now_ms()})


def failsafes_too_soon(contract: Contract, interval_s: float) -> dict[str, float]:
    """Actuator id -> failsafe delay, for each delay shorter than BEATS_PER_FAILSAFE heartbeats of interval_s."""
    return {a.id: a.failsafe.delay_s for a in contract.actuators
            if a.failsafe is not None and a.failsafe.delay_s < BEATS_PER_FAILSAFE * interval_s}


def too_soon_note(too_soon: dict[str, float], interval_s: float) -> str:
    """What a person is told of failsafes_too_soon, and what to change."""
    delays = ", ".join(f"{actuator} after {delay:g} s" for actuator, delay in sorted(too_soon.items()))
    return (f"Failsafe delays shorter than {BEATS_PER_FAILSAFE} of the controller's heartbeats (every {interval_s:g} "
            f"s): {delays}. One or two beats lost or late would set them to their failsafe values while the "
            f"controller is there. Lower --heartbeat-interval (chart failsafe.heartbeatSeconds) to at most "
            f"{min(too_soon.values()) / BEATS_PER_FAILSAFE:g} s, or build the firmware with a longer delay_s.")

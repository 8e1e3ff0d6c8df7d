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

from corral.devices.accounts import heartbeat_topic
from corral.devices.topics import Topics

DEFAULT_INTERVAL_S = 2.0
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

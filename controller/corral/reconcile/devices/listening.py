"""Whether the controller can hear devices now: the MQTT link as the reconcilers need to know it.

Apart from the reconciler because the device port (which the Intent controller and the interlocks use) asks it
too: kept here, the port needs nothing of the reconciler, and no import runs back to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# Retained `info` messages arrive right after subscribing; a Device is judged unheard of only after this.
RETAINED_GRACE_S = 3.0


@dataclass(frozen=True)
class Listening:
    """The MQTT link as the reconcilers need to know it."""

    connected: Callable[[], bool]
    up_since: Callable[[], float]

    def still_listening(self) -> bool:
        """True right after (re)connecting, while retained messages may still tell of devices."""
        return not self.connected() or time.monotonic() - self.up_since() < RETAINED_GRACE_S

    def grace_left(self) -> float:
        """How long until a Device unheard of may be judged so."""
        return RETAINED_GRACE_S - (time.monotonic() - self.up_since()) if self.connected() else RETAINED_GRACE_S

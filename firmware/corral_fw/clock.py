"""Clocks. The firmware never reads time itself: a clock is handed to it.

A clock has two readings:
  ms()        a monotonic millisecond count that never wraps (scheduling, debouncing)
  epoch_ms()  Unix epoch milliseconds (the `ts` on the wire)
"""

import time


class ManualClock:
    """A clock that moves only when told to: for tests."""

    def __init__(self, start_ms: int = 0, epoch_start_ms: int = 1764500000000):
        self.now = start_ms
        self.epoch_offset = epoch_start_ms - start_ms

    def ms(self) -> int:
        return self.now

    def epoch_ms(self) -> int:
        return self.now + self.epoch_offset

    def advance(self, delta_ms: int) -> int:
        self.now += delta_ms
        return self.now

    def run_until(self, device, end_ms: int) -> None:
        """Tick the device as its owner would (board.run), at the times it asks for, up to end_ms."""
        while True:
            wake = device.tick(self.now)
            if wake <= self.now:
                wake = self.now + 1
            if wake > end_ms:
                self.now = end_ms
                device.tick(end_ms)
                return
            self.now = wake


# Seconds between 1970-01-01 and 2000-01-01: ports whose time.time() counts from 2000 need it added.
EPOCH_2000_S = 946684800


class TicksClock:
    """MicroPython boards: time.ticks_ms() wraps around, so accumulate its differences into a count
    that does not; the epoch comes from the RTC (set it with ntptime first)."""

    def __init__(self):
        self._last = time.ticks_ms()
        self._count = 0
        self._epoch_shift_s = EPOCH_2000_S if time.gmtime(0)[0] == 2000 else 0

    def ms(self) -> int:
        now = time.ticks_ms()
        self._count += time.ticks_diff(now, self._last)
        self._last = now
        return self._count

    def epoch_ms(self) -> int:
        return time.time_ns() // 1000000 + self._epoch_shift_s * 1000

"""Debouncing a discrete input: a burst of edges becomes one event once the input has settled.

Edges arrive with their own time (as a pin interrupt would stamp them). An
input has settled when no edge came for `quiet_ms`; only then is its level
compared with the last reported (stable) one. A contact that bounces for 20 ms
and ends at a new level yields one change; one that bounces and falls back to
where it was yields none.
"""

DEFAULT_QUIET_MS = 50


class Debouncer:
    def __init__(self, name: str, initial, quiet_ms: int = DEFAULT_QUIET_MS):
        self.name = name
        self.stable = initial
        self.quiet_ms = quiet_ms
        self._level = initial
        self._first_edge_ms = None
        self._last_edge_ms = None

    def edge(self, level, t_ms: int) -> None:
        """The raw input changed to level at t_ms."""
        if level == self._level:
            return
        self._level = level
        if self._first_edge_ms is None:
            self._first_edge_ms = t_ms
        self._last_edge_ms = t_ms

    def deadline(self):
        """When poll() may next report something (ms), or None while nothing is pending."""
        if self._last_edge_ms is None:
            return None
        return self._last_edge_ms + self.quiet_ms

    def poll(self, now_ms: int):
        """(new level, time of the burst's first edge) once settled at a new level; else None."""
        if self._last_edge_ms is None or now_ms - self._last_edge_ms < self.quiet_ms:
            return None
        started = self._first_edge_ms
        self._first_edge_ms = None
        self._last_edge_ms = None
        if self._level == self.stable:
            return None
        self.stable = self._level
        return self._level, started

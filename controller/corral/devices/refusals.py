"""What the broker refused: PUBLISHes its ACLs denied, read from its debug log, counted per client and told.

Mosquitto 2.0 names a refused PUBLISH only in its debug log ("Denied PUBLISH from CLIENT (d0, q1, r0, m5,
'TOPIC', ... (2 bytes))"), and its dynamic security plugin logs nothing. The broker's client id is its
username, so CLIENT is the device id that tried. The controller reads the log's new lines twice a second
(`LogTail`, in a thread), and each client's refusals become a metric at once
(`corral_broker_refusals_total`), and per burst one audit record and one Warning Event
(`Refusals`): "device X tried to publish on Y's topics 20 times". Why the debug log and not a plugin of our
own: docs/device-trust.md ("What the broker refused").

The debug log grows with every message the broker handles (some 230 bytes each): once read past
`MAX_LOG_BYTES` it is cut to nothing (Mosquitto appends, so it writes on at the new end); a line the broker
writes between the last read and the cut is lost, which the cut's log line says.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from corral.contract.text import bounded
from corral.devices.limits import REPORT_INTERVAL_S, BurstReport, BurstReports

log = logging.getLogger(__name__)

_DENIED = re.compile(r"Denied PUBLISH from (?P<client>\S+) \(d\d, q\d, r\d, m\d+, '(?P<topic>.*)', \.\.\. "
                     r"\(\d+ bytes\)\)$")
MAX_LOG_BYTES = 8 * 2**20
MAX_LINE_BYTES = 4096  # a longer line is none of ours: topics are at most a few hundred bytes
# A burst of refusals is told once it has been quiet this long (or each minute while it lasts): attempts in
# quick succession are one story.
QUIET_S = 2.0
# Whose topics a client tried, at most this many named per report; the rest are counted together.
MAX_TARGETS = 20
OTHERS = "(other topics)"


@dataclass(frozen=True)
class Denial:
    client: str
    topic: str


def parse_denial(line: str) -> Denial | None:
    """The refused PUBLISH a broker log line names, or None for any other line."""
    if "Denied PUBLISH" not in line:
        return None
    found = _DENIED.search(line.rstrip("\r\n"))
    # The topic is the client's own text: made safe and cut, as any device text.
    return Denial(bounded(found["client"], 128), bounded(found["topic"], 160)) if found else None


@dataclass
class LogTail:
    """The whole lines appended to a file since the last read (blocking: call it in a thread)."""

    path: Path
    offset: int = -1  # -1: start at the end as it is now (what happened before is not ours to tell)
    max_bytes: int = MAX_LOG_BYTES
    _partial: bytes = b""

    def read(self) -> list[str]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            self.offset = max(self.offset, 0)  # not there yet: everything it will hold is new
            return []
        if self.offset < 0 or size < self.offset:  # first read, or the file was cut or replaced
            self.offset, self._partial = (size if self.offset < 0 else 0), b""
        if size == self.offset:
            return []
        with open(self.path, "rb") as file:
            file.seek(self.offset)
            data = file.read(size - self.offset)
        self.offset += len(data)
        data, cut = self._partial + data, -1
        cut = data.rfind(b"\n")
        self._partial = data[cut + 1:][-MAX_LINE_BYTES:]
        lines = data[:cut + 1].decode("utf-8", errors="replace").splitlines()
        if self.offset >= self.max_bytes:
            os.truncate(self.path, 0)
            log.info("broker log %s cut after %d bytes read (lines written in the last instant may be lost)",
                     self.path, self.offset)
            self.offset, self._partial = 0, b""
        return lines


@dataclass(frozen=True)
class RefusalReport:
    client: str
    burst: BurstReport
    targets: dict[str, int]  # whose topics it tried (a device id, or a topic that is no device's) -> times

    def words(self) -> str:
        said = ", ".join(f"{_whose(target)} {n} time{'s' if n != 1 else ''}"
                         for target, n in sorted(self.targets.items(), key=lambda item: -item[1]))
        return f"Device {self.client} tried to publish on {said}; the broker refused every one " \
               f"({self.burst.total} in this burst)"


@dataclass
class Refusals:
    """Refusals counted per client, told per burst (at most three reports a minute per client)."""

    quiet_s: float = QUIET_S
    _bursts: dict[str, BurstReports] = field(default_factory=dict)
    _targets: dict[str, Counter[str]] = field(default_factory=dict)

    def add(self, denial: Denial, target: str, now: float) -> RefusalReport | None:
        """target: the device id whose topic it was, or the topic itself when it is no device's."""
        burst = self._bursts.get(denial.client)
        if burst is None:
            burst = self._bursts[denial.client] = BurstReports(quiet_s=self.quiet_s, interval_s=REPORT_INTERVAL_S,
                                                               tell_start=False)
        targets = self._targets.setdefault(denial.client, Counter())
        targets[target if target in targets or len(targets) < MAX_TARGETS else OTHERS] += 1
        return self._report(denial.client, burst.drop(now))

    def tick(self, now: float) -> list[RefusalReport]:
        due = [self._report(client, burst.tick(now)) for client, burst in self._bursts.items()]
        return [r for r in due if r is not None]

    def next_tick(self) -> float | None:
        times = [t for t in (b.next_tick() for b in self._bursts.values()) if t is not None]
        return min(times) if times else None

    def _report(self, client: str, burst: BurstReport | None) -> RefusalReport | None:
        if burst is None:
            return None
        targets = dict(self._targets.pop(client, Counter()))
        return RefusalReport(client, burst, targets)


def _whose(target: str) -> str:
    if target == OTHERS:
        return "other topics"
    return f"topic {target!r}" if "/" in target else f"{target}'s topics"

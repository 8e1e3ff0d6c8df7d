"""The broker's refusals, told: `devices.refusals` read from the broker's debug log, as records and Events.

Runs beside the MQTT link when `corral run --broker-log FILE` names the log. Each refused PUBLISH counts at
once in `corral_broker_refusals_total{client}` (an enrolled device id, else "other": bounded labels); per
burst one `device.refused` audit record and one PublishRefused Warning Event on the device's Device say who
tried which topics how often.

The same lines say who the broker threw off (`devices.presence`): a client it disconnected by administrative
action (an administrator's `mosquitto_ctrl`, or our own account changes) sends no Will, so its retained status
would say `online` on. `on_presence` hears, per read, each client's last word and when the read began.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from corral.devices.presence import Presence, last_words
from corral.devices.refusals import Denial, LogTail, RefusalReport, Refusals, parse_denial
from corral.devices.topics import Topics
from corral.obs import metrics
from corral.reconcile.devices.notices import DeviceNotices

log = logging.getLogger(__name__)

POLL_S = 0.5


class RefusalTracer:
    def __init__(self, path: Path, topics: Topics, notices: DeviceNotices, enrolled: Callable[[str], bool],
                 poll_s: float = POLL_S,
                 on_presence: Callable[[dict[str, Presence], float], None] | None = None) -> None:
        self.tail = LogTail(path)
        self.on_presence = on_presence
        self.topics = topics
        self.notices = notices
        self.enrolled = enrolled  # whether a client id is an enrolled device's (else it counts as "other")
        self.refusals = Refusals()
        self.poll_s = poll_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if not self.tail.path.parent.is_dir():
            log.warning("--broker-log %s: no such directory; the broker's refusals are not read", self.tail.path)
            return
        self._task = asyncio.create_task(self._run(), name="corral-broker-refusals")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for report in self.refusals.tick(float("inf")):  # what is counted and not told yet, told now
            self._tell(report)

    async def _run(self) -> None:
        await asyncio.to_thread(self.tail.read)  # from the end as it is now: earlier refusals are not ours
        while True:
            await asyncio.sleep(self.poll_s)
            read_at = time.monotonic()  # whatever a device said after this is newer than every line read now
            try:
                lines = await asyncio.to_thread(self.tail.read)
            except OSError as err:
                log.warning("could not read the broker log %s: %s", self.tail.path, err)
                continue
            now = time.monotonic()
            for line in lines:
                denial = parse_denial(line)
                if denial is not None:
                    self._on_denial(denial, now)
            for report in self.refusals.tick(now):
                self._tell(report)
            if self.on_presence is not None and lines:
                self.on_presence(last_words(lines), read_at)

    def _on_denial(self, denial: Denial, now: float) -> None:
        metrics.BROKER_REFUSALS.labels(client=denial.client if self.enrolled(denial.client) else "other").inc()
        parsed = self.topics.parse(denial.topic)
        target = parsed[0] if parsed is not None else denial.topic
        report = self.refusals.add(denial, target, now)
        if report is not None:
            self._tell(report)

    def _tell(self, report: RefusalReport) -> None:
        self.notices.fact("device.refused", report.client, {
            "refused": report.burst.dropped, "refusedInBurst": report.burst.total, "targets": report.targets,
            "phase": report.burst.phase})
        self.notices.post_for(report.client, "PublishRefused", "Refuse", report.words(), "Warning")
        log.warning("%s", report.words())

"""Command/ack correlation: one future per command id, resolved by the ack that carries that id.

A command id is the command's identity end to end: the controller derives it
deterministically, the firmware deduplicates by it, and a retry after a
timeout or a crash reuses it, so a device never executes one change twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from corral.devices.messages import Ack
from corral.obs import metrics


class CommandTimeout(TimeoutError):
    """No ack arrived in time; the command may or may not have run (resend it with the same id)."""


class CommandTracker:
    """Waits keyed by (device id, command id): an ack counts only on the topic of the device it was sent to."""

    def __init__(self) -> None:
        self._waiting: dict[tuple[str, str], asyncio.Future[Ack]] = {}

    @property
    def in_flight(self) -> int:
        return len(self._waiting)

    def resolve(self, device_id: str, ack: Ack) -> bool:
        """Hand an ack to whoever waits for its id; False when nobody does (late or foreign ack)."""
        if ack.id is None:
            return False
        future = self._waiting.get((device_id, ack.id))
        if future is None or future.done():
            return False
        future.set_result(ack)
        return True

    async def send(
        self, device_id: str, publish: Callable[[dict[str, Any]], object], command: dict[str, Any], timeout_s: float
    ) -> Ack:
        """Publish the command and wait for its ack. Concurrent sends of one id share one wait."""
        key = (device_id, command["id"])
        future = self._waiting.get(key)
        if future is None or future.done():
            future = asyncio.get_running_loop().create_future()
            self._waiting[key] = future
        try:
            publish(command)
        except BaseException:
            # Not sent (a door refused it, or the link is down): nobody is to wait for its ack.
            if self._waiting.get(key) is future:
                del self._waiting[key]
            raise
        metrics.COMMANDS_SENT.inc()
        started = time.monotonic()
        try:
            ack = await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            metrics.COMMAND_RESULTS.labels(result="timed_out").inc()
            raise CommandTimeout(f"no ack for command {command['id']} within {timeout_s:g}s") from None
        else:
            metrics.ACK_SECONDS.observe(time.monotonic() - started)
            metrics.COMMAND_RESULTS.labels(result="acked" if ack.ok else "failed").inc()
            return ack
        finally:
            # A late ack for this id is then ignored; a resend with the same id gets the firmware's stored ack.
            if self._waiting.get(key) is future:
                del self._waiting[key]

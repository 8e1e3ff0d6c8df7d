"""Topic names of the device protocol: `{prefix}/{device_id}/{kind}`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from corral.contract.model import DEVICE_ID_PATTERN
from corral.devices.messages import Kind

_KINDS = ("info", "status", "cmd", "ack", "telemetry", "event")
_DEVICE_ID = re.compile(DEVICE_ID_PATTERN)
# What the controller listens to; `cmd` is what it sends.
INBOUND: tuple[Kind, ...] = ("info", "status", "ack", "telemetry", "event")


@dataclass(frozen=True)
class Topics:
    prefix: str = "iot"

    def of(self, device_id: str, kind: Kind) -> str:
        return f"{self.prefix}/{device_id}/{kind}"

    def subscriptions(self) -> list[str]:
        return [f"{self.prefix}/+/{kind}" for kind in INBOUND]

    def parse(self, topic: str) -> tuple[str, Kind] | None:
        """(device_id, kind) for a topic of ours, None for anything else (including malformed ids)."""
        parts = topic.split("/")
        prefix_parts = self.prefix.split("/")
        if len(parts) != len(prefix_parts) + 2 or parts[: len(prefix_parts)] != prefix_parts:
            return None
        device_id, kind = parts[-2], parts[-1]
        if kind not in _KINDS or not _DEVICE_ID.fullmatch(device_id):
            return None
        return device_id, kind  # type: ignore[return-value]  # kind is one of _KINDS, checked above

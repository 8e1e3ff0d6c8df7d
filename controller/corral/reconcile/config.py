"""Settings of `corral run`, one place with their defaults and why."""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.devices.telemetry import Coalescing


@dataclass(frozen=True)
class ControllerConfig:
    mqtt_url: str
    topic_prefix: str = "iot"
    # Where devices announced over MQTT get a Device when nobody made one for them.
    namespace: str = "default"
    auto_register: bool = True
    # Namespaces whose Devices the controller binds; empty means all.
    watch_namespaces: tuple[str, ...] = ()
    command_timeout_s: float = 5.0
    # Backoff between attempts on a device that times out or fails: min * 2**failures, capped.
    backoff_min_s: float = 1.0
    backoff_max_s: float = 60.0
    coalescing: Coalescing = field(default_factory=Coalescing)
    # lastSeen rides along with other status writes and is refreshed alone at most this often.
    last_seen_interval_s: float = 300.0
    require_signatures: bool = False
    signing_keys_secret: str | None = None  # "namespace/name"; each data entry is one trusted public key
    workers: int = 16

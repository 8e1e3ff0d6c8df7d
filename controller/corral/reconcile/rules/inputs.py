"""What a Rule reads: its input Devices as the controller knows them now, and which Rules read which Device.

Rules are evaluated by the replica that leads (holds shard 0), but a Rule's inputs may be any shard's devices. Every
replica hears every device's messages (the broker delivers them to each; mqttside.py drops another replica's
after a shard lookup), so each replica *keeps the telemetry of Rule inputs* it does not own (`KeptReadings`: the
newest sample per metric with the time this replica received it; nothing else of the message is acted on). What
the owner alone learns from MQTT, online and reported state, the leader reads from the Device's status, which
the owner writes. A device this replica owns (and a controller alone: it owns all) is read through the device port
as the Intent pipeline reads it, readings included.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from corral.api.rule import Rule
from corral.decide.evidence import Received
from corral.decide.rules import InputFacts
from corral.devices import messages
from corral.kube.cache import Key
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.port import DeviceView

log = logging.getLogger(__name__)

MAX_KEPT_METRICS = 64  # per device: a device may not grow this replica's memory by inventing metrics


class KeptReadings:
    """The newest sample per metric of Rule inputs another replica owns, as this replica received them."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.latest: dict[str, dict[str, Received]] = {}  # device id -> metric -> newest sample

    def keep(self, device_id: str, payload: bytes) -> bool:
        """A telemetry message of an input; False when it does not parse (the owner says so, not this replica)."""
        try:
            telemetry = messages.parse_telemetry(payload)
        except messages.BadMessage:
            return False
        received_ms = self.clock() * 1000
        metrics = self.latest.setdefault(device_id, {})
        for sample in telemetry.samples:
            if sample.metric in metrics or len(metrics) < MAX_KEPT_METRICS:
                metrics[sample.metric] = Received(sample.ts, received_ms, sample.value)
        return True

    def forget_except(self, device_ids: Iterable[str]) -> None:
        keep = set(device_ids)
        for device_id in [d for d in self.latest if d not in keep]:
            del self.latest[device_id]


class RuleInputs:
    """The input facts of a Rule, and the index from a Device to the Rules that read it."""

    def __init__(self, devices: DeviceCache, view_of: Callable[[str, str], DeviceView | None],
                 owns: Callable[[str], bool] = lambda device_id: True) -> None:
        self.devices = devices
        self.view_of = view_of
        # Whether this replica owns a device now: what it heard of one it gave up is not news any more.
        self.owns = owns
        self.kept = KeptReadings()
        self.readers: dict[Key, set[Key]] = {}  # (namespace, Device name) -> the Rules that read it
        self._inputs: dict[Key, tuple[str, ...]] = {}  # Rule key -> its inputs

    # ---- the index ------------------------------------------------------------------------------------------

    def index(self, key: Key, rule: Rule | None) -> None:
        """A Rule's inputs changed (or it is gone: None)."""
        for name in self._inputs.pop(key, ()):
            readers = self.readers.get((key[0], name))
            if readers is not None:
                readers.discard(key)
                if not readers:
                    del self.readers[(key[0], name)]
        if rule is not None:
            self._inputs[key] = tuple(rule.spec.inputs)
            for name in rule.spec.inputs:
                self.readers.setdefault((key[0], name), set()).add(key)
        self.kept.forget_except(self._input_ids())

    def rules_reading(self, namespace: str, name: str) -> set[Key]:
        return set(self.readers.get((namespace, name), ()))

    def rules_reading_id(self, device_id: str) -> set[Key]:
        """The Rules that read the Device(s) bound to this device id."""
        found: set[Key] = set()
        for body in self.devices.bound(device_id):
            meta = body.get("metadata") or {}
            found |= self.rules_reading(str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        return found

    def is_input(self, device_id: str) -> bool:
        return bool(self.rules_reading_id(device_id))

    def _input_ids(self) -> set[str]:
        ids = set()
        for namespace, name in self.readers:
            device = self.devices.device((namespace, name))
            if device is not None and device.spec.device_id:
                ids.add(device.spec.device_id)
        return ids

    # ---- the facts ------------------------------------------------------------------------------------------

    def facts(self, namespace: str, names: Iterable[str]) -> dict[str, InputFacts]:
        return {name: self._one(namespace, name) for name in names}

    def _one(self, namespace: str, name: str) -> InputFacts:
        view = self.view_of(namespace, name)
        if view is None or not view.bound:
            return InputFacts(name, exists=False)
        if view.known and self.owns(view.device_id or ""):
            latest = {metric: Received(r.ts, r.received_ms, r.value) for metric, r in view.latest.items()}
            return InputFacts(name, True, view.online, dict(view.reported), latest)
        # Another replica's device: presence and reported state as its owner wrote them, readings as kept here.
        device = view.device
        status = device.status if device is not None else None
        if status is None or status.online is None:
            return InputFacts(name, exists=False)
        kept = self.kept.latest.get(view.device_id or "", {})
        return InputFacts(name, True, status.online, dict(status.reported), dict(kept))

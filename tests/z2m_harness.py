"""A zigbee2mqtt stand-in on the real broker: `Z2mResponder` answers as zigbee2mqtt does, per its documentation
(zigbee2mqtt.io, "MQTT topics and messages") and its source (lib/extension/publish.ts, bridge.ts in
github:Koenkk/zigbee2mqtt), for devices whose exposes are the real definitions of zigbee-herdsman-converters
(tests/z2m_devices.py).

What it publishes, as zigbee2mqtt does:
- `<base>/bridge/state` `{"state": "online"}`, retained, and `{"state": "offline"}` as its Last Will (and on stop);
- `<base>/bridge/info`, retained, with `config.device_options.optimistic` (the `optimistic` option below);
- `<base>/bridge/devices`, retained: the device list it was given (`announce` publishes a new one, e.g. widened);
- `<base>/<friendly>/availability` `{"state": "online"|"offline"}`, retained (availability enabled);
- `<base>/<friendly>`: the device's whole state as JSON (zigbee2mqtt publishes its cached state merged with the
  change), not retained unless the device's `retain` option is set (`retain(friendly)`).

What it hears: everything under `<base>/#` (zigbee2mqtt subscribes its whole base topic), acting on
`<base>/<friendly>[/<endpoint>]/set[/<attribute>]` as publish.ts parses them: with an attribute the payload is
its value (JSON if it parses, else the text); without one it is a JSON object, or a bare ON/OFF/TOGGLE/LOCK/...
read as `{"state": ...}`. A key with an endpoint suffix (`state_l1`) or an endpoint in the topic addresses that
endpoint's property. Keys the device cannot set (no SET access bit), unknown keys and invalid values (an enum
value it does not list, a binary value that is neither value_on nor value_off, a non-number) are ignored, as
zigbee2mqtt logs them and publishes nothing for them.

What a set does to the simulated device (`behave(friendly, mode)`):
- "report" (the default): zigbee2mqtt's optimistic echo first (device option `optimistic`, on by default: once
  the Zigbee command succeeded it publishes the state with the values as requested, before the device says
  anything; off with `optimistic=False`), then, `report_delay_s` later, the device's own report: the state with
  the values as the device applied them (numbers clamped to the expose's value_min/value_max; a light turned on
  by a brightness above 0 and off by 0; a lock's lock_state following its state; a cover's position following
  OPEN/CLOSE and its state following its position; a fan's fan_state and fan_mode following each other). Both
  are whole-state messages, so the echo and the report of an unclamped value look the same: only their order
  tells them apart.
- "silent": nothing at all (the device is unreachable: the Zigbee command fails, zigbee2mqtt logs the error and
  publishes no state, optimistic or not).
- "echo_only": the optimistic echo, never a report (a device that acknowledged the command at the Zigbee level
  and did nothing).
Every set message is recorded (`sets`), so a test can tell a command was published exactly once.

It connects with the account it is given (a source account of the controller's bridge ACLs, or an observer's):
with a source account the broker drops its state publishes until a person accepted the device, so
`resend(friendly)` republishes availability and state once the grants are in.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import paho.mqtt.client as mqtt

from tests.broker_harness import Broker
from tests.harness import wait_for

ACCESS_STATE, ACCESS_SET = 0b001, 0b010
Mode = Literal["report", "silent", "echo_only"]
# Bare payloads zigbee2mqtt reads as {"state": payload} on `<friendly>/set` (publish.ts STATE_VALUES).
STATE_VALUES = ("on", "off", "toggle", "open", "close", "stop", "lock", "unlock")
# The composites whose features are properties of the state itself (the others nest an object under their own).
FLAT_COMPOSITES = ("light", "switch", "lock", "climate", "cover", "fan")


@dataclass(frozen=True)
class SetMessage:
    """A command zigbee2mqtt received, as it arrived."""

    friendly: str
    topic: str
    payload: bytes
    at: float


@dataclass
class _Device:
    friendly: str
    settable: dict[str, dict[str, Any]]  # property -> its expose (a feature of a composite, or a top-level one)
    state: dict[str, Any]
    composites: dict[str, str]  # property -> the type of its composite (light, lock, cover, ...), "" at top level
    endpoints: set[str] = field(default_factory=set)
    mode: Mode = "report"
    retain: bool = False
    online: bool = True


def _initial(expose: Mapping[str, Any]) -> Any:
    kind = expose.get("type")
    if kind == "binary":
        return expose.get("value_off")
    if kind == "numeric":
        low = expose.get("value_min")
        high = expose.get("value_max")
        if isinstance(low, int | float) and isinstance(high, int | float):
            return low if expose.get("name") in ("brightness", "position") else (low + high) / 2
        return low if isinstance(low, int | float) else 0
    if kind == "enum":
        values = expose.get("values") or [None]
        return values[0]
    if kind == "text":
        return ""
    return None


def _read_device(entry: Mapping[str, Any]) -> _Device:
    settable: dict[str, dict[str, Any]] = {}
    composites: dict[str, str] = {}
    state: dict[str, Any] = {}
    endpoints: set[str] = set()
    for expose in (entry.get("definition") or {}).get("exposes") or []:
        if expose.get("endpoint"):
            endpoints.add(expose["endpoint"])
        parts = expose.get("features") if expose.get("type") in FLAT_COMPOSITES else [expose]
        for part in parts or []:
            prop, access = part.get("property"), part.get("access", 0)
            if not isinstance(prop, str) or part.get("type") == "composite":
                continue
            composites[prop] = expose.get("type") if expose.get("type") in FLAT_COMPOSITES else ""
            if access & ACCESS_STATE:
                state[prop] = _initial(part)
            if access & ACCESS_SET:
                settable[prop] = part
    if "color_temp" in state:
        state["color_mode"] = "color_temp"
    # A consistent start: a closed cover at position 0, an unlocked lock saying so.
    if composites.get("position") == "cover" and "state" in state:
        state["state"] = "OPEN" if state.get("position") else "CLOSE"
    if composites.get("lock_state") == "lock":
        state["lock_state"] = "locked" if str(state.get("state")).upper() == "LOCK" else "unlocked"
    return _Device(entry["friendly_name"], settable, state, composites, endpoints)


class Z2mResponder:
    """zigbee2mqtt with the given devices, on the broker, as `credentials` (see the module's docstring)."""

    def __init__(self, broker: Broker, credentials: tuple[str, str], base_topic: str,
                 devices: bytes | list[dict[str, Any]], *, optimistic: bool = True, report_delay_s: float = 0.2,
                 states: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.broker, self.base = broker, base_topic
        self.devices: list[dict[str, Any]] = json.loads(devices) if isinstance(devices, bytes) else list(devices)
        self.optimistic, self.report_delay_s = optimistic, report_delay_s
        self._lock = threading.RLock()
        self._devices = {d.friendly: d for d in (_read_device(e) for e in self.devices if e.get("type") != "Coordinator")}
        for friendly, values in (states or {}).items():
            self._devices[friendly].state.update(values)
        self.sets: list[SetMessage] = []
        self.published: list[tuple[str, dict[str, Any], bool]] = []  # (topic, payload, retained), in order
        self._timers: list[threading.Timer] = []
        self._pending = 0  # reports scheduled and not yet published (counted under the lock, with the publish)
        self._subscribed = threading.Event()
        username, password = credentials
        # The broker takes the username for the client id (one connection per account); a zigbee2mqtt client id is
        # no concern of the tests.
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=username, protocol=mqtt.MQTTv311)
        self.client.username_pw_set(username, password)
        self.client.will_set(f"{base_topic}/bridge/state", json.dumps({"state": "offline"}), qos=1, retain=True)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self._connected: threading.Event = threading.Event()
        self._refused: list[str] = []
        self.client.on_connect = self._on_connect

    # -- life --------------------------------------------------------------------------------------------------------

    def start(self) -> Z2mResponder:
        self.client.connect("127.0.0.1", self.broker.mqtt_port, keepalive=10)
        self.client.loop_start()
        wait_for(lambda: self._connected.is_set() or bool(self._refused), "zigbee2mqtt's broker connection",
                 timeout_s=10)
        if self._refused:
            raise AssertionError(f"the broker refused zigbee2mqtt's account: {self._refused[0]}")
        self.client.subscribe(f"{self.base}/#", qos=1)
        assert self._subscribed.wait(10), "zigbee2mqtt could not subscribe its base topic"
        self._publish("bridge/state", {"state": "online"}, retain=True)
        self._publish("bridge/info", self.info(), retain=True)
        self.announce()
        for friendly in self._devices:
            self.resend(friendly)
        return self

    def stop(self) -> None:
        with self._lock:
            for timer in self._timers:
                timer.cancel()
        try:
            self._publish("bridge/state", {"state": "offline"}, retain=True).wait_for_publish(5)
        except (RuntimeError, ValueError):
            pass  # not connected (the broker went first): its Last Will says offline instead
        self.client.disconnect()
        self.client.loop_stop()

    def __enter__(self) -> Z2mResponder:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _on_connect(self, _c: Any, _u: Any, _f: Any, reason: Any, _p: Any = None) -> None:
        if getattr(reason, "is_failure", False):
            self._refused.append(str(reason))
        else:
            self._connected.set()

    # -- what a test changes ----------------------------------------------------------------------------------------

    def announce(self, devices: list[dict[str, Any]] | None = None) -> None:
        """Publish bridge/devices (retained): the list given at start, or a new one (which then also defines what
        the devices accept)."""
        with self._lock:
            if devices is not None:
                self.devices = devices
                for entry in devices:
                    if entry.get("type") == "Coordinator":
                        continue
                    fresh = _read_device(entry)
                    old = self._devices.get(fresh.friendly)
                    if old is not None:
                        fresh.state.update(old.state)
                        fresh.mode, fresh.retain, fresh.online = old.mode, old.retain, old.online
                    self._devices[fresh.friendly] = fresh
            payload = json.dumps(self.devices).encode()
        self.client.publish(f"{self.base}/bridge/devices", payload, qos=1, retain=True).wait_for_publish(10)

    def info(self) -> dict[str, Any]:
        """`bridge/info` as zigbee2mqtt publishes it (retained), reduced to what a reader of its options needs: the
        version, and in `config` the base topic, availability, the default device options and each device's."""
        with self._lock:
            devices = {e["ieee_address"]: {"friendly_name": e["friendly_name"]} for e in self.devices
                       if e.get("type") != "Coordinator" and "ieee_address" in e}
        return {"version": "2.6.0", "coordinator": {"type": "EmberZNet"}, "permit_join": False,
                "config": {"mqtt": {"base_topic": self.base}, "availability": {"enabled": True},
                           "device_options": {"optimistic": self.optimistic, "retain": False}, "devices": devices}}

    def behave(self, friendly: str, mode: Mode) -> None:
        with self._lock:
            self._devices[friendly].mode = mode

    def retain(self, friendly: str, retained: bool = True) -> None:
        """zigbee2mqtt's device option `retain`: its state messages are published retained."""
        with self._lock:
            self._devices[friendly].retain = retained

    def set_available(self, friendly: str, online: bool) -> None:
        with self._lock:
            self._devices[friendly].online = online
        self._publish(f"{friendly}/availability", {"state": "online" if online else "offline"},
                      retain=True).wait_for_publish(10)

    def report(self, friendly: str, **values: Any) -> None:
        """The device reports new values (a sensor reading, a change made at the device): its whole state."""
        with self._lock:
            device = self._devices[friendly]
            device.state.update(values)
            sent = self._publish_state(device)
        sent.wait_for_publish(10)  # on the broker when this returns (never on paho's thread: it would wait for itself)

    def resend(self, friendly: str) -> None:
        """Availability and state again (e.g. once the broker grants the device's topics to this account)."""
        with self._lock:
            device = self._devices[friendly]
            self._publish(f"{friendly}/availability", {"state": "online" if device.online else "offline"},
                          retain=True)
            sent = self._publish_state(device)
        sent.wait_for_publish(10)

    def pending_reports(self) -> int:
        """Device reports scheduled and not yet published."""
        with self._lock:
            return self._pending

    def state(self, friendly: str) -> dict[str, Any]:
        with self._lock:
            return dict(self._devices[friendly].state)

    def sets_for(self, friendly: str) -> list[SetMessage]:
        with self._lock:
            return [s for s in self.sets if s.friendly == friendly]

    def wait_for_sets(self, friendly: str, count: int = 1, timeout_s: float = 10) -> list[SetMessage]:
        wait_for(lambda: len(self.sets_for(friendly)) >= count, f"{count} set message(s) for {friendly}",
                 timeout_s=timeout_s)
        return self.sets_for(friendly)

    # -- zigbee2mqtt --------------------------------------------------------------------------------------------------

    def _publish(self, subtopic: str, payload: Mapping[str, Any], retain: bool = False) -> mqtt.MQTTMessageInfo:
        topic = f"{self.base}/{subtopic}"
        with self._lock:
            self.published.append((topic, dict(payload), retain))
        return self.client.publish(topic, json.dumps(payload), qos=1, retain=retain)

    def _publish_state(self, device: _Device, overlay: Mapping[str, Any] | None = None) -> mqtt.MQTTMessageInfo:
        return self._publish(device.friendly, {**device.state, **(overlay or {})}, retain=device.retain)

    def _on_message(self, _c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        arrived = time.monotonic()
        parsed = self._parse_topic(message.topic)
        if parsed is None:
            return
        device, endpoint, attribute = parsed
        with self._lock:
            self.sets.append(SetMessage(device.friendly, message.topic, bytes(message.payload), arrived))
        values = _parse_message(attribute, message.payload)
        if values is None:
            return
        self._apply(device, endpoint, values)

    def _parse_topic(self, topic: str) -> tuple[_Device, str | None, str | None] | None:
        """publish.ts parseTopic: `<base>/<name>[/<endpoint>]/set[/<attribute>]`."""
        if not topic.startswith(self.base + "/"):
            return None
        levels = topic[len(self.base) + 1:].split("/")
        if "set" not in levels[1:]:
            return None
        at = len(levels) - 1 - levels[::-1].index("set")  # the last `set`: friendly names may contain levels
        name, rest = levels[:at], levels[at + 1:]
        if len(rest) > 1:
            return None
        attribute = rest[0] if rest else None
        with self._lock:
            whole = "/".join(name)
            if whole in self._devices:
                return self._devices[whole], None, attribute
            device = self._devices.get("/".join(name[:-1])) if len(name) > 1 else None
            if device is not None and name[-1] in device.endpoints:
                return device, name[-1], attribute
        return None

    def _apply(self, device: _Device, endpoint: str | None, values: Mapping[str, Any]) -> None:
        with self._lock:
            if device.mode == "silent":
                return
            requested: dict[str, Any] = {}
            for key, value in values.items():
                prop = f"{key}_{endpoint}" if endpoint and f"{key}_{endpoint}" in device.settable else key
                expose = device.settable.get(prop)
                if expose is None:
                    continue  # "No converter available": logged by zigbee2mqtt, nothing published
                accepted = _accept(expose, value, device.state.get(prop))
                if accepted is not _INVALID:
                    requested[prop] = accepted
            if not requested:
                return
            if self.optimistic:
                self._publish_state(device, requested)
                device.state.update(requested)
            if device.mode == "echo_only":
                return
            applied = _device_applies(device, requested)
            timer = threading.Timer(self.report_delay_s, self._report, (device.friendly, applied))
            timer.daemon = True
            self._timers.append(timer)
            self._pending += 1
            timer.start()

    def _report(self, friendly: str, applied: Mapping[str, Any]) -> None:
        with self._lock:
            device = self._devices[friendly]
            device.state.update(applied)
            self._publish_state(device)
            self._pending -= 1


_INVALID = object()


def _parse_message(attribute: str | None, payload: bytes | bytearray) -> dict[str, Any] | None:
    """publish.ts parseMessage."""
    text = payload.decode("utf-8", errors="replace")
    if attribute:
        try:
            return {attribute: json.loads(text)}
        except ValueError:
            return {attribute: text}
    try:
        parsed = json.loads(text)
    except ValueError:
        return {"state": text} if text.lower() in STATE_VALUES else None
    return parsed if isinstance(parsed, dict) else None


def _accept(expose: Mapping[str, Any], value: Any, current: Any) -> Any:
    """The value as zigbee2mqtt's converter takes it (normalized, not yet clamped), or _INVALID."""
    kind = expose.get("type")
    if kind == "binary":
        on, off, toggle = expose.get("value_on"), expose.get("value_off"), expose.get("value_toggle")
        if isinstance(value, str) and isinstance(toggle, str) and value.lower() == toggle.lower():
            return off if current == on else on
        for candidate in (on, off):
            if value == candidate or (isinstance(value, str) and isinstance(candidate, str)
                                      and value.lower() == candidate.lower()):
                return candidate
        return _INVALID
    if kind == "numeric":
        if isinstance(value, bool):
            return _INVALID
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                return _INVALID
        return value if isinstance(value, int | float) else _INVALID
    if kind == "enum":
        for candidate in expose.get("values") or []:
            if str(candidate).lower() == str(value).lower():
                return candidate
        return _INVALID
    if kind == "text":
        return value if isinstance(value, str) else _INVALID
    return _INVALID


def _clamped(expose: Mapping[str, Any], value: Any) -> Any:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return value
    low, high = expose.get("value_min"), expose.get("value_max")
    if isinstance(low, int | float) and value < low:
        value = low
    if isinstance(high, int | float) and value > high:
        value = high
    return value


def _device_applies(device: _Device, requested: Mapping[str, Any]) -> dict[str, Any]:
    """What the device reports after doing what was asked."""
    applied = {prop: _clamped(device.settable[prop], value) for prop, value in requested.items()}
    for prop, value in list(applied.items()):
        composite = device.composites.get(prop, "")
        tail = next((f"_{e}" for e in sorted(device.endpoints) if prop.endswith(f"_{e}")), "")
        base = prop[: -len(tail)] if tail else prop
        if composite == "light" and base == "brightness" and f"state{tail}" not in requested:
            applied[f"state{tail}"] = "ON" if value else "OFF"  # moveToLevelWithOnOff
        if composite == "light" and base == "color_temp":
            applied["color_mode"] = "color_temp"
        if composite == "lock" and base == "state" and f"lock_state{tail}" in device.state:
            applied[f"lock_state{tail}"] = "locked" if str(value).upper() == "LOCK" else "unlocked"
        if composite == "cover" and base == "state" and f"position{tail}" in device.state:
            upper = str(value).upper()
            if upper in ("OPEN", "CLOSE"):
                applied[f"position{tail}"] = 100 if upper == "OPEN" else 0
        if composite == "fan" and base == "fan_mode":  # zigbee2mqtt's fan state follows the fan's mode
            applied["fan_state"] = "OFF" if str(value).lower() == "off" else "ON"
        if composite == "fan" and base == "fan_state" and "fan_mode" not in requested:
            applied["fan_mode"] = "on" if str(value).upper() == "ON" else "off"
        if composite == "cover" and base == "position":
            applied[f"state{tail}"] = "OPEN" if value else "CLOSE"
    return applied


@contextmanager
def z2m_responder(broker: Broker, credentials: tuple[str, str], devices: bytes | list[dict[str, Any]],
                  base_topic: str | None = None, **options: Any) -> Iterator[Z2mResponder]:
    """A started responder until the block ends (a fresh base topic unless one is given)."""
    with Z2mResponder(broker, credentials, base_topic or f"z2m-{uuid.uuid4().hex[:8]}", devices, **options) as z2m:
        yield z2m

"""A simulated fleet: many firmware instances, each with its own MQTT connection, on one thread.

Every device is the real firmware (`corral_fw.device.Device`) on a simulated
board, with its own paho client, client id, Last Will and flash. The fleet
does not start a network thread per client (500 devices would be 500
threads): it drives all clients from one selector loop with paho's external
loop API (loop_read / loop_write / loop_misc, and the on_socket_* callbacks
that say when a socket opens, closes, or has something to write). Device
ticks, reconnects and faults are timers on the same loop.

Faults, all deterministic for a seed:
  drop link     the TCP connection dies without DISCONNECT (the broker publishes
                the Will `offline`); the firmware keeps running and reconnects later
  delay acks    every ack leaves the device ack_delay_ms after the command ran
  power cycle   the connection dies, the firmware instance is gone (state, dedup
                memory, event sequence); after power_off_s a fresh instance boots
                from the same flash (counter totals survive)

Thread safety: `run()` owns everything. Other threads talk to a running fleet
only through `call_soon()` and `stop()`.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import selectors
import socket
import ssl
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt

from corral_fw.device import Device
from corral_fw.profiles import firmware_options
from corral_fw.rng import Rng
from corral_fw.simboard import SimBoard
from corral_fw.store import MemoryStore
from corral_fw.transport_paho import PahoTransport
from corral_sim.catalog import contract_for, normalize_type

DEFAULT_PORT = 1883
MISC_INTERVAL_MS = 1000
SHUTDOWN_TIMEOUT_S = 5.0


class FleetError(Exception):
    """A fleet that cannot be built or started, with a message for the person who asked."""


@dataclass(frozen=True)
class Broker:
    """Where the devices connect, and as whom: each device with its own account (username = device id,
    its password from `credentials`, as enrollment issued it), or all with one (`username`, for brokers
    that do not authenticate devices one by one)."""

    host: str
    port: int = DEFAULT_PORT
    username: str | None = None
    password: str | None = None
    credentials: Mapping[str, str] | None = None  # device id -> password
    tls: bool = False
    ca_file: str | None = None

    @classmethod
    def from_url(cls, url: str, credentials: Mapping[str, str] | None = None, ca_file: str | None = None) -> Broker:
        """`mqtt://[user[:password]@]host[:port]` or `mqtts://...` (also `tcp://`, or a bare `host[:port]`)."""
        text = url.strip()
        if "://" not in text:
            text = "mqtt://" + text
        parsed = urllib.parse.urlsplit(text)
        if parsed.scheme not in ("mqtt", "mqtts", "tcp"):
            raise FleetError(f"unsupported broker URL {url!r}: use mqtt://host:port or mqtts://host:8883 "
                             "(WebSockets are not supported)")
        tls = parsed.scheme == "mqtts"
        try:
            port = parsed.port or (8883 if tls else DEFAULT_PORT)
        except ValueError as err:
            raise FleetError(f"bad broker URL {url!r}: {err}") from err
        if not parsed.hostname:
            raise FleetError(f"bad broker URL {url!r}: no host")
        username = urllib.parse.unquote(parsed.username) if parsed.username else None
        password = urllib.parse.unquote(parsed.password) if parsed.password else None
        return cls(parsed.hostname, port, username, password, credentials, tls, ca_file)

    def account(self, device_id: str) -> tuple[str | None, str | None]:
        if self.credentials is not None:
            if device_id not in self.credentials:
                raise FleetError(f"no credential for device {device_id}: enroll it (`corral devices enroll`)")
            return device_id, self.credentials[device_id]
        return self.username, self.password

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


@dataclass(frozen=True)
class Faults:
    drop_link_every_s: float | None = None  # mean time between link drops, per device
    link_down_s: float = 3.0  # how long a dropped link stays down
    ack_delay_ms: int = 0
    power_cycle_every_s: float | None = None  # mean time between power cycles, per device
    power_off_s: float = 5.0


@dataclass(frozen=True)
class DeviceSpec:
    device_type: str
    device_id: str
    room: str = ""


@dataclass(frozen=True)
class FleetOptions:
    prefix: str = "iot"
    telemetry_interval_s: float = 5.0
    seed: int = 0
    faults: Faults = field(default_factory=Faults)
    keepalive_s: int = 30
    reconnect_min_s: float = 1.0
    reconnect_max_s: float = 30.0
    connect_spread_s: float = 1.0  # a big fleet connects over this long, not all in one burst
    auto_inputs: bool = True  # simulated doors, leak probes... change by themselves now and then
    # Device type -> the contract its firmware was built with instead of the catalog's (a signed build).
    firmware_contracts: dict[str, dict[str, Any]] = field(default_factory=dict)


class SystemClock:
    """The firmware's clock on CPython: a monotonic ms count and the wall clock for `ts`."""

    def ms(self) -> int:
        return int(time.monotonic() * 1000)

    def epoch_ms(self) -> int:
        return int(time.time() * 1000)


class SimulatedDevice:
    """One device of the fleet: its spec, its flash (outlives power cycles) and its current firmware instance."""

    def __init__(self, spec: DeviceSpec, contract: dict[str, Any]) -> None:
        self.spec = spec
        self.contract = contract
        self.flash = MemoryStore()
        self.generation = 0
        self.powered = False
        self.firmware: Device | None = None
        self.board: SimBoard | None = None
        self.transport: _FleetTransport | None = None
        self.boots = 0
        self.tick_token = 0
        self.tick_at: int | None = None  # when the pending tick is due
        self.reconnect_delay_s = 0.0
        self.next_link_down_s: float | None = None  # set by a link drop: how long before reconnecting
        self.fault_rng: Rng | None = None
        self.stale_epochs_retired = 0  # stale-epoch refusals of firmware instances a power cycle ended

    @property
    def stale_epochs(self) -> int:
        """Commands this hardware refused for a stale controller epoch, over every boot (a test's proof that a
        replica which lost the device was turned away at the device itself)."""
        current = self.firmware.stale_epochs if self.firmware is not None else 0
        return self.stale_epochs_retired + current

    @property
    def device_id(self) -> str:
        return self.spec.device_id

    @property
    def connected(self) -> bool:
        return self.transport is not None and self.transport.connected


class _FleetTransport(PahoTransport):
    """A device's paho transport as the fleet runs it: acks may be held back (the ack-delay fault)."""

    def __init__(self, fleet: Fleet, device: Device, client_id: str, keepalive_s: int, broker: Broker) -> None:
        username, password = broker.account(device.device_id)
        super().__init__(device, client_id, keepalive_s, username, password, fleet.tls_context)
        self.fleet = fleet
        self.after_message: Callable[[], None] | None = None

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        super()._on_message(client, userdata, message)
        if self.after_message is not None:
            self.after_message()  # a heartbeat may bring a failsafe deadline nearer than the pending tick

    def _publish_now(self, topic: str, payload: str, retain: bool, qos: int) -> None:
        PahoTransport.publish(self, topic, payload, retain, qos)

    def publish(self, topic: str, payload: str, retain: bool, qos: int) -> bool:
        delay = self.fleet.options.faults.ack_delay_ms
        if delay > 0 and topic == self.device.topic_ack:
            self.fleet._after(delay, functools.partial(self._publish_now, topic, payload, retain, qos))
            return True
        return super().publish(topic, payload, retain, qos)


class Fleet:
    def __init__(self, specs: Iterable[DeviceSpec], broker: Broker, options: FleetOptions | None = None,
                 clock: Any = None, log: Callable[[str], None] | None = None) -> None:
        self.broker = broker
        self.options = options or FleetOptions()
        if self.options.telemetry_interval_s <= 0:
            raise FleetError("the telemetry interval must be positive")
        prefix = self.options.prefix
        if not prefix or "+" in prefix or "#" in prefix or prefix.startswith("/") or prefix.endswith("/"):
            raise FleetError(f"bad topic prefix {prefix!r}: no wildcards (+, #) and no leading or trailing '/'")
        self.tls_context: ssl.SSLContext | None = None
        if broker.tls:
            self.tls_context = ssl.create_default_context(cafile=broker.ca_file)  # one for every device
        self.clock = clock or SystemClock()
        self.log = log or (lambda line: None)
        self.devices: dict[str, SimulatedDevice] = {}
        for spec in specs:
            if spec.device_id in self.devices:
                raise FleetError(f"device id {spec.device_id!r} is used twice")
            normalized = DeviceSpec(normalize_type(spec.device_type), spec.device_id, spec.room)
            contract = self.options.firmware_contracts.get(normalized.device_type) or contract_for(normalized.device_type)
            self.devices[spec.device_id] = SimulatedDevice(normalized, contract)
        self._selector = selectors.DefaultSelector()
        self._timers: list[tuple[int, int, Callable[[], None]]] = []
        self._sequence = itertools.count()
        self._calls: deque[Callable[[], None]] = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stop = threading.Event()
        self._started = threading.Event()
        self._retired: list[mqtt.Client] = []
        self.stats = {"boots": 0, "connects": 0, "link_drops": 0, "power_cycles": 0, "connect_failures": 0,
                      "refused": 0, "clean_offline": 0}
        self._told_refused: set[str] = set()

    # Control from any thread -----------------------------------------------------------

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run fn on the fleet's thread, soon."""
        self._calls.append(fn)
        self._wake()

    def stop(self) -> None:
        """Ask run() to stop cleanly (every device publishes retained offline and disconnects). Signal-safe."""
        self._stop.set()
        self._wake()

    def wait_started(self, timeout_s: float = 10.0) -> bool:
        return self._started.wait(timeout_s)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass

    # Faults and inspection (call on the fleet's thread, e.g. through call_soon) ----------

    def drop_link(self, device_id: str, down_s: float | None = None) -> None:
        """Kill the device's TCP connection without DISCONNECT; it reconnects after down_s."""
        device = self.devices[device_id]
        if device.transport is None or device.transport.client.socket() is None:
            return
        self.stats["link_drops"] += 1
        device.next_link_down_s = self.options.faults.link_down_s if down_s is None else down_s
        _kill_socket(device.transport.client)

    def power_cycle(self, device_id: str, off_s: float | None = None) -> None:
        """Cut the power: connection dies uncleanly, firmware state is lost; a fresh instance boots after off_s."""
        device = self.devices[device_id]
        if not device.powered:
            return
        self.stats["power_cycles"] += 1
        device.powered = False
        device.generation += 1
        if device.firmware is not None:
            device.stale_epochs_retired += device.firmware.stale_epochs
        if device.transport is not None:
            old = device.transport
            old.on_link_change = None
            old.connected = False
            _kill_socket(old.client)
            self._retired.append(old.client)
        off = self.options.faults.power_off_s if off_s is None else off_s
        self._after(int(off * 1000), lambda: self._boot(device))

    def change_input(self, device_id: str, name: str, value: str, bounce_ms: int = 20) -> None:
        """A simulated input (a door contact, a leak probe) moves to value now, bouncing for bounce_ms."""
        device = self.devices[device_id]
        if device.board is None or not device.powered:
            return
        device.board.change_input(name, value, self.clock.ms(), bounce_ms)
        self._schedule_tick(device, self.clock.ms())

    def set_sensor(self, device_id: str, metric: str, value: Any) -> None:
        """A simulated sensor reads value from now on (water reaches a leak probe); None: simulated readings again.
        The firmware reports it with its next telemetry."""
        device = self.devices[device_id]
        if device.board is not None:
            device.board.set_sensor(metric, value)

    def jam(self, device_id: str, actuator_id: str, jammed: bool = True) -> None:
        """The device's actuator stops moving; commands to it fail with an error ack until unjammed."""
        device = self.devices[device_id]
        if device.board is not None:
            device.board.jam(actuator_id, jammed)

    def set_locally(self, device_id: str, actuator_id: str, value: Any) -> None:
        """A person changes an actuator at the device (not through MQTT); the firmware reports its new state."""
        device = self.devices[device_id]
        if device.firmware is not None and device.powered:
            device.firmware.set_locally(actuator_id, value)

    def summary(self) -> dict[str, Any]:
        devices = list(self.devices.values())
        return {
            **self.stats,
            "devices": len(devices),
            "connected": sum(1 for d in devices if d.connected),
            "telemetry_sent": sum(d.firmware.telemetry_sent for d in devices if d.firmware),
            "executions": sum(d.firmware.executions for d in devices if d.firmware),
            "stale_epochs": sum(d.stale_epochs for d in devices),
        }

    # The loop ---------------------------------------------------------------------------

    def run(self, duration_s: float | None = None) -> None:
        """Boot every device and run until stop() (or for duration_s); then stop cleanly."""
        start = self.clock.ms()
        deadline = None if duration_s is None else start + int(duration_s * 1000)
        count = len(self.devices)
        spread_ms = int(self.options.connect_spread_s * 1000)
        for index, device in enumerate(self.devices.values()):
            offset = index * spread_ms // count if count > 1 else 0
            self._at(start + offset, functools.partial(self._boot, device))
        next_misc = start + MISC_INTERVAL_MS
        self._started.set()
        try:
            while not self._stop.is_set():
                now = self.clock.ms()
                if deadline is not None and now >= deadline:
                    break
                self._run_due(now)
                if now >= next_misc:
                    self._loop_misc()
                    next_misc = now + MISC_INTERVAL_MS
                self._poll(self._timeout_s(self.clock.ms(), next_misc, deadline))
        finally:
            self._shutdown()

    def _timeout_s(self, now: int, next_misc: int, deadline: int | None) -> float:
        if self._calls:
            return 0.0
        wake = next_misc
        if self._timers:
            wake = min(wake, self._timers[0][0])
        if deadline is not None:
            wake = min(wake, deadline)
        return max(0.0, (wake - now) / 1000)

    def _poll(self, timeout_s: float) -> None:
        for key, mask in self._selector.select(timeout_s):
            client = key.data
            if client is None:
                try:
                    self._wake_r.recv(4096)
                except BlockingIOError:
                    pass
                continue
            if mask & selectors.EVENT_READ:
                client.loop_read()
                sock = client.socket()
                # TLS may have decrypted more than one read returned; the selector would not say so.
                while isinstance(sock, ssl.SSLSocket) and sock.pending():
                    client.loop_read()
            # Flush what reading produced (acks, info/online after CONNACK) before any timer can run.
            if mask & selectors.EVENT_WRITE or client.want_write():
                client.loop_write()

    def _run_due(self, now: int) -> None:
        while self._calls:
            self._calls.popleft()()
        while self._timers and self._timers[0][0] <= now:
            _, _, callback = heapq.heappop(self._timers)
            callback()

    def _loop_misc(self) -> None:
        for device in self.devices.values():
            if device.transport is not None and device.transport.client.socket() is not None:
                device.transport.client.loop_misc()

    def _at(self, due_ms: int, callback: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (due_ms, next(self._sequence), callback))

    def _after(self, delay_ms: int, callback: Callable[[], None]) -> None:
        self._at(self.clock.ms() + delay_ms, callback)

    # Device life cycle -------------------------------------------------------------------

    def _boot(self, device: SimulatedDevice) -> None:
        """Power on: a fresh firmware instance on a fresh board and a fresh MQTT client."""
        spec, options = device.spec, self.options
        device.generation += 1
        device.boots += 1
        device.powered = True
        self.stats["boots"] += 1
        generation = device.generation
        now = self.clock.ms()
        seed = options.seed
        interval_ms = max(1, int(options.telemetry_interval_s * 1000))
        phase_ms = Rng.for_device(seed, spec.device_id, "phase").randint(0, interval_ms - 1)
        # The simulated world goes on across power cycles: a rebooted board reads on from a new stream.
        board = SimBoard(device.contract, spec.device_id, seed + 1_000_003 * (device.boots - 1), spec.device_type, now,
                         auto_inputs=options.auto_inputs, clock=self.clock)
        firmware = Device(
            device.contract, spec.device_id, board, self.clock, prefix=options.prefix, telemetry_ms=interval_ms,
            store=device.flash, phase_ms=phase_ms, **firmware_options(spec.device_type),
        )
        transport = _FleetTransport(self, firmware, f"{options.prefix}/{spec.device_id}", options.keepalive_s, self.broker)
        transport.on_link_change = lambda t, up: self._link_changed(device, generation, up)
        transport.after_message = lambda: self._wake_earlier(device, generation)
        client = transport.client
        client.on_socket_open = self._socket_open
        client.on_socket_close = self._socket_close
        client.on_socket_register_write = self._socket_want_write
        client.on_socket_unregister_write = self._socket_written
        device.firmware, device.board, device.transport = firmware, board, transport
        device.reconnect_delay_s = options.reconnect_min_s
        if device.fault_rng is None:
            device.fault_rng = Rng.for_device(seed, spec.device_id, "faults")
            self._schedule_faults(device)
        self._connect(device, generation, first=True)
        self._schedule_tick(device, firmware.next_wakeup(now))

    def _schedule_tick(self, device: SimulatedDevice, at_ms: int) -> None:
        """One pending tick per device: a new one replaces the old (whose token no longer matches)."""
        device.tick_token += 1
        device.tick_at = at_ms
        token = device.tick_token
        self._at(at_ms, lambda: self._tick(device, token))

    def _wake_earlier(self, device: SimulatedDevice, generation: int) -> None:
        """After a message: tick sooner if the firmware now wants to (its failsafe clock was re-armed)."""
        if device.generation != generation or device.firmware is None or not device.powered:
            return
        now = self.clock.ms()
        wake = max(device.firmware.next_wakeup(now), now + 1)
        if device.tick_at is None or wake < device.tick_at:
            self._schedule_tick(device, wake)

    def _tick(self, device: SimulatedDevice, token: int) -> None:
        if device.tick_token != token or device.firmware is None or not device.powered:
            return
        now = self.clock.ms()
        wake = device.firmware.tick(now)
        self._schedule_tick(device, max(wake, now + 1))

    def _connect(self, device: SimulatedDevice, generation: int, first: bool = False) -> None:
        if device.generation != generation or self._stop.is_set() or device.transport is None:
            return
        try:
            if first:
                device.transport.connect(self.broker.host, self.broker.port)
            else:
                device.transport.reconnect()
        except OSError as err:
            self.stats["connect_failures"] += 1
            if self.stats["connect_failures"] == 1:
                self.log(f"cannot reach the broker at {self.broker.url} ({err}); devices keep retrying")
            delay = device.reconnect_delay_s
            device.reconnect_delay_s = min(delay * 2, self.options.reconnect_max_s)
            self._after(int(delay * 1000), lambda: self._connect(device, generation))

    def _link_changed(self, device: SimulatedDevice, generation: int, up: bool) -> None:
        if device.generation != generation:
            return
        if up:
            self.stats["connects"] += 1
            device.reconnect_delay_s = self.options.reconnect_min_s
            return
        if self._stop.is_set():
            return
        refusal = device.transport.refusal if device.transport is not None else None
        if refusal is not None:
            self.stats["refused"] += 1
            if device.device_id not in self._told_refused:
                self._told_refused.add(device.device_id)
                self.log(f"the broker refused {device.device_id}: {refusal} (is it enrolled, with this credential?); "
                         "it keeps retrying")
        if device.next_link_down_s is not None:
            delay, device.next_link_down_s = device.next_link_down_s, None
        else:
            delay = device.reconnect_delay_s
        self._after(int(delay * 1000), lambda: self._connect(device, generation))

    def _schedule_faults(self, device: SimulatedDevice) -> None:
        faults, rng = self.options.faults, device.fault_rng
        assert rng is not None
        if faults.drop_link_every_s:
            every_drop = faults.drop_link_every_s

            def drop() -> None:
                if device.powered and device.connected:
                    self.drop_link(device.device_id)
                self._after(rng.exponential_ms(every_drop * 1000), drop)

            self._after(rng.exponential_ms(every_drop * 1000), drop)
        if faults.power_cycle_every_s:
            every_cycle = faults.power_cycle_every_s

            def cycle() -> None:
                if device.powered:
                    self.power_cycle(device.device_id)
                self._after(rng.exponential_ms(every_cycle * 1000), cycle)

            self._after(rng.exponential_ms(every_cycle * 1000), cycle)

    # paho's external-loop callbacks -----------------------------------------------------

    def _socket_open(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        try:  # small messages (acks) go out at once, not after a delayed ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        self._selector.register(sock, selectors.EVENT_READ, client)

    def _socket_close(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        if client in self._retired:
            self._retired.remove(client)

    def _socket_want_write(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        try:
            self._selector.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, client)
        except (KeyError, ValueError):
            pass

    def _socket_written(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        try:
            self._selector.modify(sock, selectors.EVENT_READ, client)
        except (KeyError, ValueError):
            pass

    # Clean stop -------------------------------------------------------------------------

    def _shutdown(self) -> None:
        """Every connected device publishes retained offline, then DISCONNECTs; wait until the bytes are out."""
        self._stop.set()
        self._timers.clear()
        for device in self.devices.values():
            device.generation += 1
            transport = device.transport
            if transport is None:
                continue
            transport.on_link_change = None
            if transport.connected:
                transport.close()
                self.stats["clean_offline"] += 1
            elif transport.client.socket() is not None:
                _kill_socket(transport.client)
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        while len(self._selector.get_map()) > 1 and time.monotonic() < deadline:
            self._poll(0.1)
        for key in list(self._selector.get_map().values()):
            if key.data is not None:  # still not out after the timeout: give up on it
                self._selector.unregister(key.fileobj)
                socket_of(key.fileobj).close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()


def socket_of(registered: Any) -> socket.socket:
    """What paho and the selector hand back is the socket the fleet registered."""
    assert isinstance(registered, socket.socket)
    return registered


def _kill_socket(client: mqtt.Client) -> None:
    """End a client's TCP connection without an MQTT DISCONNECT, as a power cut or a dead link would."""
    sock = client.socket()
    if sock is None:
        return
    try:
        socket_of(sock).shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def device_specs(counts: dict[str, int], start: int = 1) -> list[DeviceSpec]:
    """N devices per type, with ids like relay-1, env-fan-2."""
    specs = []
    for device_type, count in counts.items():
        normalized = normalize_type(device_type)
        for n in range(start, start + count):
            specs.append(DeviceSpec(normalized, f"{normalized.replace('_', '-')}-{n}"))
    return specs

"""The device side of Corral's MQTT contract protocol (docs/protocol.md).

A Device is one firmware instance: a contract (a build-time constant), a
device id, a board (the hardware, real or simulated), a clock and, once
connected, a transport. It never blocks and never reads the time itself; its
owner calls

    will()                      -> (topic, payload) to set as Last Will before connecting
    on_connect()                after every (re)connect: subscribe, retained info, retained online
    on_message(topic, payload, retained=False)
                                for every message received: commands -> acks; the controller's heartbeat
    tick(now_ms) -> next_ms     sensors, telemetry, debounced events, failsafes, on-time limits; call again at
                                next_ms
                                (after a message, next_wakeup(now_ms) may be sooner: a heartbeat re-arms
                                the failsafe clock)
    shutdown()                  before a clean disconnect: retained offline (a Will fires only on loss)

Failsafe (docs/protocol.md, "Heartbeat and failsafe"): an actuator whose contract declares
`failsafe: {"value", "delay_s"}` is moved to that value once delay_s have passed since the last heartbeat
the device heard (on its monotonic clock), once per loss, and the device says so in a `state` event with
value `failsafe`. The countdown runs from boot until a first heartbeat arrives: a device that never hears a
controller fails safe as well. A retained message never counts as a heartbeat; the controller's Last Will
(`{"state": "gone"}`) only names the cause, since the clock already runs from the last heartbeat. A
heartbeat ends the loss; the device never restores the old value itself (the controller drives it again).

On-time limits (docs/protocol.md, "On-time limits"): an actuator whose contract declares `max_on_seconds` is
switched to its off value (false, or "off" for an enum) once it has been on that long without going off, on the
device's own monotonic clock, controller or not, and the device says so in a `state` event with value `max_on`
(and a `max_on` record per actuator in that event and in every ack until the actuator is set again; the record is
kept in the store, so a reboot does not forget it and the controller does not drive it on again). The clock
starts when the actuator goes from off to any on value (a command, a local change, a failsafe, or boot in an on
value) and stops only when it goes off: a repeated on command, or a change between on values (low -> high), does
not restart it, so the limit bounds continuous on-time whoever asks. If the hardware does not move, the device
reports the error and tries again every minute (sooner for a shorter limit).

Epoch (docs/protocol.md, "Epoch"): with several controller replicas, a command may carry `"epoch": int`, the
sending replica's hold on the device (its Lease's acquire time, in ms). The device keeps the highest epoch it has
seen, in RAM, and refuses a command with a lower one: a replica that lost the device to another cannot drive it
any more, whatever it believes. A command without an epoch (a controller alone) is accepted. A resent command id
still gets its stored ack first (the new owner resuming an Intent must see the old owner's answer, and the
hardware acts once); a refusal for a stale epoch is not stored, so the same id from the new owner still runs.

A transport has `publish(topic, payload, retain, qos) -> bool` (False when the
message could not be handed to the network) and `subscribe(topic, qos)`.
A board has `read(metric)`, `apply(actuator_id, value, units)`,
`input_level(name)`, `input_edges(now_ms)` and `next_input_ms()`.
"""

import json

from corral_fw.actuators import Refused, failsafe_of, make_actuator, max_on_of, show
from corral_fw.debounce import DEFAULT_QUIET_MS, Debouncer
from corral_fw.dedup import DEFAULT_SIZE, AckCache
from corral_fw.ringbuf import RingBuffer

DEFAULT_PREFIX = "iot"
DEFAULT_TELEMETRY_MS = 5000
ONLINE = "online"
OFFLINE = "offline"
GET_STATE = "get_state"
STATE_EVENT = "state"
MAX_ID_CHARS = 64
MAX_COMMAND_BYTES = 4096
QOS_TELEMETRY = 0
QOS_RELIABLE = 1
HEARTBEAT_TOPIC = "_corral/heartbeat"  # under the prefix; only the controller may publish there
MAX_HEARTBEAT_BYTES = 512
EPOCH = "epoch"
STALE_EPOCH = "stale_epoch"  # the ack field saying which epoch was refused and which one the device holds
FAILSAFE = "failsafe"
MAX_ON = "max_on"  # the on-time limit's word: the state event's value, the field in events and acks
LIMIT_RETRY_MS = 60000  # an actuator that did not move at its limit is tried again this often (at most)
# What the device knew of the controller when a failsafe was applied.
CONTROLLER_UNSEEN = "unseen"  # no heartbeat since boot
CONTROLLER_SILENT = "silent"  # heartbeats stopped, no word why (a hung controller, a cut link)
CONTROLLER_GONE = "gone"  # its Last Will (or its clean stop) said so


class Device:
    def __init__(
        self,
        contract: dict,
        device_id: str,
        board,
        clock,
        prefix: str = DEFAULT_PREFIX,
        telemetry_ms: int = DEFAULT_TELEMETRY_MS,
        samples_per_report: int = 1,
        ring_size: int = 0,
        debounce_ms: int = DEFAULT_QUIET_MS,
        dedup_size: int = DEFAULT_SIZE,
        store=None,
        phase_ms: int = 0,
    ):
        if telemetry_ms < 1 or samples_per_report < 1:
            raise ValueError("telemetry_ms and samples_per_report must be positive")
        self.contract = contract
        self.device_id = device_id
        self.board = board
        self.clock = clock
        self.store = store
        self.transport = None

        base = prefix + "/" + device_id + "/"
        self.topic_info = base + "info"
        self.topic_status = base + "status"
        self.topic_cmd = base + "cmd"
        self.topic_ack = base + "ack"
        self.topic_telemetry = base + "telemetry"
        self.topic_event = base + "event"
        self.topic_heartbeat = prefix + "/" + HEARTBEAT_TOPIC

        info = {}
        for key in contract:
            info[key] = contract[key]
        info["device_id"] = device_id
        self.info_payload = json.dumps(info)

        saved = store.load() if store is not None else {}
        counters = saved.get("counters", {})
        self.actuators = []
        self._by_id = {}
        commands = [GET_STATE]
        for spec in contract.get("actuators", []):
            actuator = make_actuator(spec, contract.get("fw", ""), counters.get(spec["id"], 0))
            self.actuators.append(actuator)
            self._by_id[actuator.id] = actuator
            if actuator.action not in commands:
                commands.append(actuator.action)
        self.commands = sorted(commands)
        self._acks = AckCache(dedup_size)

        # Failsafes: (actuator, value, delay_ms) from the contract (checked: a bad one refuses to build).
        self._failsafes = []
        for actuator in self.actuators:
            failsafe = failsafe_of(actuator)
            if failsafe is not None:
                self._failsafes.append((actuator, failsafe[0], failsafe[1]))
        self._heard_ms = clock.ms()  # the last heartbeat; boot counts as one (see the module docstring)
        self.controller = CONTROLLER_UNSEEN
        self._tripped = {}  # actuator id -> True: its failsafe was handled during the current loss
        self.failsafe_state = {}  # actuator id -> why it sits at its failsafe value (until set again)

        # On-time limits: (actuator, off value, limit_ms) from the contract (checked like the failsafes).
        self._limits = []
        self._limit_of = {}
        for actuator in self.actuators:
            limit = max_on_of(actuator)
            if limit is not None:
                self._limits.append((actuator, limit[0], limit[1]))
                self._limit_of[actuator.id] = limit
        self._on_since = {}  # actuator id -> clock.ms() when it went on (absent: off)
        self._limit_retry = {}  # actuator id -> when to try again an off that failed
        self.max_on_state = {}  # actuator id -> the limit switched it off (until set again; kept in the store)
        kept = saved.get("max_on", {})
        now = clock.ms()
        for actuator, off, _limit_ms in self._limits:
            if actuator.id in kept and actuator.value == off:
                self.max_on_state[actuator.id] = kept[actuator.id]
            self._track_on(actuator, now)

        self.metrics = [s["metric"] for s in contract.get("sensors", [])]
        self.samples_per_report = samples_per_report
        self.sample_ms = max(1, telemetry_ms // samples_per_report)
        capacity = max(ring_size, samples_per_report)
        self._buffers = {}
        for metric in self.metrics:
            self._buffers[metric] = RingBuffer(capacity)
        now = clock.ms()
        # The first sample is one period after boot, shifted by phase_ms (a fleet spreads its devices out).
        self._next_sample = now + self.sample_ms + phase_ms % self.sample_ms
        self._samples_taken = 0

        self._debouncers = {}
        for spec in contract.get("events", []):
            level = board.input_level(spec["name"])
            if level is not None:
                self._debouncers[spec["name"]] = Debouncer(spec["name"], level, debounce_ms)

        # What happened, for the owner and for tests: counted on the device itself.
        self.executions = 0
        self.duplicates = 0
        self.errors = 0
        self.connects = 0
        self.telemetry_sent = 0
        self.local_changes = 0
        self.event_seq = 0
        self.heartbeats = 0
        self.failsafes_applied = 0
        self.limits_applied = 0  # actuators switched off by their on-time limit
        self.stale_epochs = 0  # commands refused because a newer controller epoch had been seen

        self.epoch = None  # the highest controller epoch seen since boot (RAM only; None: none yet)

    # Connection -------------------------------------------------------------------------

    def will(self):
        return self.topic_status, OFFLINE

    def on_connect(self) -> None:
        """Subscribe first, so that `online` (published after) means commands are heard."""
        self.connects += 1
        self.transport.subscribe(self.topic_cmd, QOS_RELIABLE)
        if self._failsafes:
            self.transport.subscribe(self.topic_heartbeat, QOS_TELEMETRY)
        self._publish(self.topic_info, self.info_payload, True, QOS_RELIABLE)
        self._publish(self.topic_status, ONLINE, True, QOS_RELIABLE)
        # The state after a boot or a time away may not be what the controller last heard.
        self._publish_state("connect")

    def shutdown(self) -> None:
        """A clean stop: say offline ourselves; the broker drops the Will on a normal DISCONNECT."""
        self._publish(self.topic_status, OFFLINE, True, QOS_RELIABLE)

    def on_message(self, topic: str, payload, retained: bool = False) -> None:
        if topic == self.topic_heartbeat:
            self.on_heartbeat(payload, retained, self.clock.ms())
            return
        if topic != self.topic_cmd:
            return
        self._publish(self.topic_ack, self.handle_command(payload), False, QOS_RELIABLE)

    def _publish(self, topic: str, payload: str, retain: bool, qos: int) -> bool:
        if self.transport is None:
            return False
        return self.transport.publish(topic, payload, retain, qos)

    # Commands ---------------------------------------------------------------------------

    def state(self) -> dict:
        state = {}
        for actuator in self.actuators:
            state[actuator.id] = actuator.value
        return state

    def handle_command(self, payload) -> str:
        """One command payload in, its ack (JSON text) out. A repeated id returns the stored ack."""
        if len(payload) > MAX_COMMAND_BYTES:
            return self._error(None, "malformed command: larger than " + str(MAX_COMMAND_BYTES) + " bytes")
        try:
            if type(payload) is not str:
                payload = bytes(payload).decode()
            command = json.loads(payload)
        except Exception:
            return self._error(None, "malformed command: not JSON")
        if type(command) is not dict:
            return self._error(None, "malformed command: not a JSON object")
        command_id = command.get("id")
        if type(command_id) is not str or not 1 <= len(command_id) <= MAX_ID_CHARS:
            return self._error(None, "malformed command: 'id' must be a string of 1-" + str(MAX_ID_CHARS) + " characters")
        epoch = command.get(EPOCH)
        if epoch is not None and (type(epoch) is not int or epoch < 0):
            return self._error(command_id, "malformed command: 'epoch' must be a whole number >= 0 (or absent)")
        stored = self._acks.get(command_id)
        if stored is not None:
            self.duplicates += 1
            self._see_epoch(epoch)
            return stored
        if epoch is not None and self.epoch is not None and epoch < self.epoch:
            # Not stored under the id: the owner that holds the newer epoch may send this very id and must be heard.
            self.stale_epochs += 1
            self.errors += 1
            return self._ack(command_id, False, "stale epoch " + str(epoch) + ": this device has seen epoch "
                             + str(self.epoch) + " from the controller that now owns it; a command needs an epoch"
                             + " >= " + str(self.epoch) + " (or none)", stale=(epoch, self.epoch))
        self._see_epoch(epoch)
        ack = self._execute(command_id, command)
        self._acks.put(command_id, ack)
        return ack

    def _execute(self, command_id: str, command: dict) -> str:
        cmd = command.get("cmd")
        if type(cmd) is not str:
            return self._error(command_id, "malformed command: 'cmd' must be a string")
        if cmd not in self.commands:
            return self._error(command_id, "unknown command " + show(cmd) + "; commands: " + ", ".join(self.commands))
        params = command.get("params")
        if params is None:
            params = {}
        if type(params) is not dict:
            return self._error(command_id, "malformed command: 'params' must be an object")
        if cmd == GET_STATE:
            return self._ack(command_id, True, None)

        actuator_id = params.get("actuator")
        actuator = self._by_id.get(actuator_id) if type(actuator_id) is str else None
        if actuator is None:
            names = [a.id for a in self.actuators if a.action == cmd]
            what = "missing params.actuator" if actuator_id is None else "unknown actuator " + show(actuator_id)
            return self._error(command_id, what + "; actuators for " + cmd + ": " + ", ".join(names))
        if actuator.action != cmd:
            return self._error(command_id, "actuator '" + actuator.id + "' takes " + actuator.action + ", not " + cmd)
        if "value" not in params:
            return self._error(command_id, "missing params.value for actuator '" + actuator.id + "'")
        requested = params["value"]
        try:
            applied, clamped = actuator.resolve(requested)
        except Refused as refusal:
            return self._error(command_id, str(refusal))

        units = actuator.units_for(applied)
        try:
            self.board.apply(actuator.id, applied, units)
        except Exception as failure:
            return self._error(command_id, "actuator '" + actuator.id + "' failed: " + str(failure))
        actuator.apply(applied)
        self.failsafe_state.pop(actuator.id, None)  # set again: no longer at its failsafe value for a loss
        forgot = self._forget_limit(actuator.id)
        self._track_on(actuator, self.clock.ms())
        self.executions += 1
        if actuator.type == "counter" or forgot:
            self._save()
        if clamped:
            return self._ack(command_id, True, None, {"actuator": actuator.id, "requested": requested, "applied": applied})
        return self._ack(command_id, True, None)

    def _see_epoch(self, epoch) -> None:
        if epoch is not None and (self.epoch is None or epoch > self.epoch):
            self.epoch = epoch

    def _ack(self, command_id, ok: bool, error, clamped=None, stale=None) -> str:
        ack = {"id": command_id, "ok": ok, "error": error, "state": self.state()}
        if clamped is not None:
            ack["clamped"] = clamped
        if stale is not None:
            ack[STALE_EPOCH] = {"sent": stale[0], "seen": stale[1]}
        if self.failsafe_state:
            ack[FAILSAFE] = self.failsafe_state
        if self.max_on_state:
            ack[MAX_ON] = self.max_on_state
        return json.dumps(ack)

    def _error(self, command_id, message: str) -> str:
        self.errors += 1
        return self._ack(command_id, False, message)

    def set_locally(self, actuator_id: str, value) -> None:
        """Someone changed an actuator at the device itself (a button, a knob): apply it, report the full state."""
        actuator = self._by_id[actuator_id]
        applied, _ = actuator.resolve(value)
        self.board.apply(actuator.id, applied, actuator.units_for(applied))
        actuator.apply(applied)
        self.failsafe_state.pop(actuator.id, None)
        forgot = self._forget_limit(actuator.id)
        self._track_on(actuator, self.clock.ms())
        self.local_changes += 1
        if actuator.type == "counter" or forgot:
            self._save()
        self._publish_state("local")

    def _publish_state(self, cause: str, failsafe=None, max_on=None) -> None:
        """The full state; with `failsafe` (actuator id -> why) when actuators sit at failsafe values, and
        `max_on` when their on-time limit switched them off."""
        self.event_seq += 1
        event = {"ts": self.clock.epoch_ms(), "event": STATE_EVENT, "value": cause, "seq": self.event_seq,
                 "state": self.state()}
        if failsafe is None:
            failsafe = self.failsafe_state
        if failsafe:
            event[FAILSAFE] = failsafe
        if max_on is None:
            max_on = self.max_on_state
        if max_on:
            event[MAX_ON] = max_on
        self._publish(self.topic_event, json.dumps(event), False, QOS_RELIABLE)

    # The controller's heartbeat and the failsafe -----------------------------------------

    def on_heartbeat(self, payload, retained: bool, now_ms: int) -> None:
        """A message on the heartbeat topic. Only a live beat (`alive` with a `seq`, not retained) counts; a
        retained `alive` (the controller replacing its Will) may be old and proves nothing."""
        if len(payload) > MAX_HEARTBEAT_BYTES:
            return
        try:
            if type(payload) is not str:
                payload = bytes(payload).decode()
            message = json.loads(payload)
        except Exception:
            return
        if type(message) is not dict:
            return
        state = message.get("state")
        if state == CONTROLLER_GONE:
            # The clock already runs from the last beat (the will comes later, if at all): only the cause is new.
            self.controller = CONTROLLER_GONE
        elif state == "alive" and not retained and "seq" in message:
            self._heard_ms = now_ms
            self.controller = "alive"
            if self._tripped:
                self._tripped = {}  # the loss is over: the next one trips the failsafes again
            self.heartbeats += 1

    def _check_failsafes(self, now_ms: int) -> None:
        lost_ms = now_ms - self._heard_ms
        for actuator, value, delay_ms in self._failsafes:
            if lost_ms < delay_ms or actuator.id in self._tripped:
                continue
            self._tripped[actuator.id] = True  # once per loss, whatever happens next
            if actuator.value == value:
                continue
            controller = self.controller if self.controller != "alive" else CONTROLLER_SILENT
            record = {"value": value, "heartbeat_lost_ms": lost_ms, "controller": controller,
                      "ts": self.clock.epoch_ms()}
            try:
                self.board.apply(actuator.id, value, actuator.units_for(value))
            except Exception as failure:
                self.errors += 1
                record["error"] = "actuator '" + actuator.id + "' failed: " + str(failure)
                failed = dict(self.failsafe_state)
                failed[actuator.id] = record
                self._publish_state(FAILSAFE, failed)
                continue
            actuator.apply(value)
            self.failsafes_applied += 1
            self.failsafe_state[actuator.id] = record
            if self._forget_limit(actuator.id):
                self._save()
            self._track_on(actuator, now_ms)
            self._publish_state(FAILSAFE)

    # On-time limits ---------------------------------------------------------------------

    def _track_on(self, actuator, now_ms: int) -> None:
        """Start the on-time clock when a limited actuator goes on; stop it when it goes off. Staying on (a
        repeated command, another on value) leaves it running: the limit bounds continuous on-time."""
        limit = self._limit_of.get(actuator.id)
        if limit is None:
            return
        if actuator.value == limit[0]:
            self._on_since.pop(actuator.id, None)
            self._limit_retry.pop(actuator.id, None)
        elif actuator.id not in self._on_since:
            self._on_since[actuator.id] = now_ms

    def _limit_due(self, actuator_id: str, limit_ms: int):
        since = self._on_since.get(actuator_id)
        if since is None:
            return None
        retry = self._limit_retry.get(actuator_id)
        return since + limit_ms if retry is None else retry

    def _check_limits(self, now_ms: int) -> None:
        for actuator, off, limit_ms in self._limits:
            due = self._limit_due(actuator.id, limit_ms)
            if due is None or now_ms < due:
                continue
            record = {"value": off, "on_ms": now_ms - self._on_since[actuator.id],
                      "max_on_s": actuator.spec["max_on_seconds"], "ts": self.clock.epoch_ms()}
            try:
                self.board.apply(actuator.id, off, actuator.units_for(off))
            except Exception as failure:
                self.errors += 1
                self._limit_retry[actuator.id] = now_ms + min(limit_ms, LIMIT_RETRY_MS)
                record["error"] = "actuator '" + actuator.id + "' failed: " + str(failure)
                failed = dict(self.max_on_state)
                failed[actuator.id] = record
                self._publish_state(MAX_ON, None, failed)
                continue
            actuator.apply(off)
            self.limits_applied += 1
            self.failsafe_state.pop(actuator.id, None)  # off now, whatever the failsafe had set
            self.max_on_state[actuator.id] = record
            self._save()  # a reboot must not forget it: the controller would switch the actuator on again
            self._track_on(actuator, now_ms)
            self._publish_state(MAX_ON)

    def _forget_limit(self, actuator_id: str) -> bool:
        """Set again: no longer switched off by its limit. Whether there was a record (the store needs saving)."""
        return self.max_on_state.pop(actuator_id, None) is not None

    def _save(self) -> None:
        """What must survive a reboot: counter totals, and which actuators their on-time limit switched off."""
        if self.store is None:
            return
        counters = {}
        for actuator in self.actuators:
            if actuator.type == "counter":
                counters[actuator.id] = actuator.value
        data = {"counters": counters}
        if self.max_on_state:
            data["max_on"] = self.max_on_state
        self.store.save(data)

    # Sensors, telemetry, events -------------------------------------------------------

    def tick(self, now_ms: int) -> int:
        """Do what is due at now_ms; returns when the next thing will be due."""
        if self._failsafes:
            self._check_failsafes(now_ms)
        if self._limits:
            self._check_limits(now_ms)
        if self.metrics and now_ms >= self._next_sample:
            self._sample()
            self._samples_taken += 1
            if self._samples_taken % self.samples_per_report == 0:
                self._report()
            self._next_sample += self.sample_ms
            if now_ms - self._next_sample >= self.sample_ms:
                self._next_sample = now_ms + self.sample_ms  # fell far behind: skip, don't burst
        if self._debouncers:
            for name, level, t_ms in self.board.input_edges(now_ms):
                debouncer = self._debouncers.get(name)
                if debouncer is not None:
                    debouncer.edge(level, t_ms)
            for debouncer in self._debouncers.values():
                change = debouncer.poll(now_ms)
                if change is not None:
                    self._event(debouncer.name, change[0], change[1], now_ms)
        return self.next_wakeup(now_ms)

    def next_wakeup(self, now_ms: int) -> int:
        wake = self._next_sample if self.metrics else now_ms + 60000
        for debouncer in self._debouncers.values():
            deadline = debouncer.deadline()
            if deadline is not None and deadline < wake:
                wake = deadline
        if self._debouncers:
            edge = self.board.next_input_ms()
            if edge is not None and edge < wake:
                wake = edge
        for actuator, _value, delay_ms in self._failsafes:
            if actuator.id not in self._tripped and self._heard_ms + delay_ms < wake:
                wake = self._heard_ms + delay_ms
        for actuator, _off, limit_ms in self._limits:
            due = self._limit_due(actuator.id, limit_ms)
            if due is not None and due < wake:
                wake = due
        return wake

    def _sample(self) -> None:
        ts = self.clock.epoch_ms()
        for metric in self.metrics:
            value = self.board.read(metric)
            if value is not None:
                self._buffers[metric].push({"metric": metric, "value": value, "ts": ts})

    def _report(self) -> None:
        samples = []
        for metric in self.metrics:
            samples.extend(self._buffers[metric].items())
        if not samples:
            return
        payload = json.dumps({"ts": self.clock.epoch_ms(), "samples": samples})
        if self._publish(self.topic_telemetry, payload, False, QOS_TELEMETRY):
            self.telemetry_sent += 1
            for buffer in self._buffers.values():
                buffer.clear()
        # Otherwise the samples stay: the ring keeps the newest ones until the link is back.

    def _event(self, name: str, value, started_ms: int, now_ms: int) -> None:
        self.event_seq += 1
        ts = self.clock.epoch_ms() - (now_ms - started_ms)
        payload = json.dumps({"ts": ts, "event": name, "value": value, "seq": self.event_seq})
        self._publish(self.topic_event, payload, False, QOS_RELIABLE)

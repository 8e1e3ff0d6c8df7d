"""Simulated hardware for one device: what the simulator gives the firmware instead of pins and I2C.

- Sensors read a baseline plus a mean-reverting random walk, from a PRNG seeded
  by (seed, device id): the same seed gives the same readings on every run and
  on CPython and MicroPython alike. A gated sensor reads 0 while its output is
  off (no load on an open relay, no flow through a closed valve); a boosted one
  reads higher while its output is on (an SHT30 with its heater running); a
  level sensor reads what its output's setting draws (a space heater on low
  or high). An output counts as on unless it is false, "off" or not yet set.
- Outputs take the value the firmware applies; `applied` records every call,
  so a test can count executions on the hardware side (and, given a clock,
  `applied_ms` when each happened on its monotonic count).
- Inputs (door contacts, leak probes) change now and then; every change
  arrives as a burst of bouncing edges, as a real contact's would.
- A sensor can be held at a value (a profile's `value`, or `set_sensor`): a
  leak probe reads False until a test or a person makes it read True.
"""

from corral_fw.profiles import DEFAULT_BOUNCE_MS, DEFAULT_INPUT_INTERVAL_S, SENSOR_DEFAULTS, profile
from corral_fw.rng import Rng


def output_on(value) -> bool:
    """False, "off" and an output never set are off; any other value (true, "low", "high") is on."""
    return value is not None and value is not False and value != "off"


class SimSensor:
    def __init__(self, spec: dict, rng: Rng, options: dict, gate, boost=None, level=None):
        metric = spec["metric"]
        default = SENSOR_DEFAULTS.get(metric)
        value_range = spec.get("range")
        if default is None:
            low = value_range["min"] if value_range else 0.0
            high = value_range["max"] if value_range else 100.0
            default = ((low + high) / 2.0, (high - low) / 200.0, 2)
        self.baseline = options.get("baseline", default[0])
        self.jitter = options.get("jitter", default[1])
        self.decimals = options.get("decimals", default[2])
        self.low = value_range["min"] if value_range else None
        self.high = value_range["max"] if value_range else None
        self.gate = gate
        self.boost = boost  # (output, amount): amount added while that output is on
        self.level = level  # (output, {setting: reading}): reads that setting's figure, 0 for any other
        self.rng = rng
        self.offset = 0.0
        self.held = options.get("value")  # not None: the sensor reads exactly this (a leak probe's True/False)

    def read(self, outputs: dict):
        self.offset = self.offset * 0.9 + self.rng.uniform(-self.jitter, self.jitter)
        if self.held is not None:
            return self.held
        if self.gate is not None and not output_on(outputs.get(self.gate)):
            return 0
        value = self.baseline + self.offset
        if self.level is not None:
            drawn = self.level[1].get(outputs.get(self.level[0]))
            if drawn is None:
                return 0
            value = drawn + self.offset
        if self.boost is not None and output_on(outputs.get(self.boost[0])):
            value += self.boost[1]
        if self.low is not None:
            value = min(max(value, self.low), self.high)
        if self.decimals == 0:
            return int(value + 0.5) if value >= 0 else -int(-value + 0.5)
        return round(value, self.decimals)


class SimInput:
    def __init__(self, spec: dict, options: dict):
        self.name = spec["name"]
        self.values = spec["values"]
        self.level = options.get("initial", self.values[0])
        self.mean_ms = int(options.get("mean_interval_s", DEFAULT_INPUT_INTERVAL_S) * 1000)
        self.next_change = None


class SimBoard:
    def __init__(self, contract: dict, device_id: str, seed: int, device_type: str = "", now_ms: int = 0,
                 auto_inputs: bool = True, clock=None):
        p = profile(device_type)
        gates = p.get("gates", {})
        boosts = p.get("boosts", {})
        levels = p.get("levels", {})
        sensor_options = p.get("sensors", {})
        input_options = p.get("inputs", {})
        self.device_id = device_id
        self.outputs = {}
        self.applied = []
        self.applied_ms = []  # clock.ms() of each entry of `applied`, when a clock is given
        self.clock = clock
        self.jammed = set()
        self.sensors = {}
        for spec in contract.get("sensors", []):
            metric = spec["metric"]
            rng = Rng.for_device(seed, device_id, "sensor/" + metric)
            self.sensors[metric] = SimSensor(spec, rng, sensor_options.get(metric, {}), gates.get(metric),
                                            boosts.get(metric), levels.get(metric))
        self.inputs = {}
        self._input_rng = Rng.for_device(seed, device_id, "inputs")
        self._edges = []  # (t_ms, name, level), in time order
        for spec in contract.get("events", []):
            sim_input = SimInput(spec, input_options.get(spec["name"], {}))
            if auto_inputs and len(sim_input.values) > 1:
                sim_input.next_change = now_ms + self._input_rng.exponential_ms(sim_input.mean_ms)
            self.inputs[spec["name"]] = sim_input
        for spec in contract.get("actuators", []):
            self.outputs[spec["id"]] = None

    # The board interface the firmware uses -------------------------------------------

    def read(self, metric: str):
        sensor = self.sensors.get(metric)
        return None if sensor is None else sensor.read(self.outputs)

    def apply(self, actuator_id: str, value, units: int) -> None:
        if actuator_id in self.jammed:
            raise OSError("jammed: the actuator did not move")
        self.outputs[actuator_id] = value
        self.applied.append((actuator_id, value, units))
        if self.clock is not None:
            self.applied_ms.append(self.clock.ms())

    def set_sensor(self, metric: str, value) -> None:
        """The sensor reads value from now on (water reaches a leak probe); None: its simulated readings again."""
        self.sensors[metric].held = value

    def jam(self, actuator_id: str, jammed: bool = True) -> None:
        """A fault: the actuator stops moving (a stuck motor, a welded relay); the firmware reports the failure."""
        if jammed:
            self.jammed.add(actuator_id)
        else:
            self.jammed.discard(actuator_id)

    def input_level(self, name: str):
        sim_input = self.inputs.get(name)
        return None if sim_input is None else sim_input.level

    def input_edges(self, now_ms: int) -> list:
        for sim_input in self.inputs.values():
            if sim_input.next_change is not None and sim_input.next_change <= now_ms:
                others = [v for v in sim_input.values if v != sim_input.level]
                target = others[self._input_rng.randint(0, len(others) - 1)]
                self.change_input(sim_input.name, target, sim_input.next_change)
                sim_input.next_change += self._input_rng.exponential_ms(sim_input.mean_ms)
        due = []
        while self._edges and self._edges[0][0] <= now_ms:
            t_ms, name, level = self._edges.pop(0)
            due.append((name, level, t_ms))
        return due

    def next_input_ms(self):
        wake = self._edges[0][0] if self._edges else None
        for sim_input in self.inputs.values():
            if sim_input.next_change is not None and (wake is None or sim_input.next_change < wake):
                wake = sim_input.next_change
        return wake

    # Driving the simulated world --------------------------------------------------------

    def change_input(self, name: str, level, at_ms: int, bounce_ms: int = DEFAULT_BOUNCE_MS) -> None:
        """The input moves to level at at_ms, bouncing between old and new level for bounce_ms."""
        sim_input = self.inputs[name]
        old = sim_input.level
        sim_input.level = level
        times = [at_ms]
        if bounce_ms > 0:
            inner = sorted(self._input_rng.randint(1, bounce_ms - 1) for _ in range(3)) if bounce_ms > 1 else []
            times.extend(at_ms + t for t in inner)
            times.append(at_ms + bounce_ms)
        edges = []
        for i, t in enumerate(times):
            edges.append((t, name, level if i % 2 == 0 else old))
        if edges[-1][2] != level:
            edges.append((times[-1] + 1, name, level))
        self._edges.extend(edges)
        self._edges.sort(key=lambda edge: edge[0])

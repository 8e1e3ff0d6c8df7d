"""Per device type: how its firmware samples, and how its simulated hardware behaves.

None of this is contract: the contract says what a device measures and does;
a profile says how often it samples (a weight scale samples five times per
report into its ring buffer) and, for the simulator, around which value a
sensor reads, which output gates it (no flow through a closed valve) and how
often an input changes (a door opens every few minutes). A boost adds to a
reading while an output is on (the SHT30 reads warm while its heater runs);
a level sensor reads what an enum output's setting draws (a space heater's
load on low or high, 0 while off). An output is on unless it is false, "off"
or not yet set.

Sensor defaults by metric: (baseline, jitter, decimals). A reading is the
baseline plus a mean-reverting random walk with steps up to `jitter`.
"""

SENSOR_DEFAULTS = {
    "temperature": (21.5, 0.15, 2),
    "humidity": (45.0, 0.8, 1),
    "rssi": (-62.0, 2.0, 0),
    "battery": (96.0, 0.05, 1),
    "load": (60.0, 4.0, 1),
    "flow": (6.0, 0.4, 2),
    "weight": (1250.0, 0.6, 1),
    "food_level": (80.0, 0.2, 1),
}

# Inputs change at random (exponential waiting times) with this mean unless a profile says otherwise.
DEFAULT_INPUT_INTERVAL_S = 900
# A mechanical contact bounces this long on every change (the firmware debounces it).
DEFAULT_BOUNCE_MS = 20

PROFILES = {
    "scale": {"samples_per_report": 5, "ring_size": 60, "sensors": {"weight": {"baseline": 1250.0}}},
    "relay": {"gates": {"load": "relay"}},
    "water_valve": {
        "gates": {"flow": "open"},
        "inputs": {"leak": {"initial": "dry", "mean_interval_s": 3600}},
    },
    "door_contact": {"inputs": {"door": {"initial": "closed", "mean_interval_s": 300}}},
    # A sensor with a `value` reads exactly that (a dry probe) until the simulator is told otherwise.
    "leak_probe": {"sensors": {"wet": {"value": False}}},
    "lock": {"inputs": {"door": {"initial": "closed", "mean_interval_s": 900}}},
    "sht30": {
        "sensors": {"temperature": {"baseline": 22.8}, "humidity": {"baseline": 55.0}},
        "boosts": {"temperature": ("heater", 3.5)},
    },
    "pet_feeder": {"sensors": {"food_level": {"baseline": 70.0}}},
    "space_heater": {
        "levels": {"load": ("power", {"low": 1000.0, "high": 2000.0})},
        "boosts": {"temperature": ("power", 2.5)},
    },
}


def profile(device_type: str) -> dict:
    return PROFILES.get(device_type, {})


def firmware_options(device_type: str) -> dict:
    """Keyword arguments for Device: sampling per report and ring buffer size."""
    p = profile(device_type)
    return {"samples_per_report": p.get("samples_per_report", 1), "ring_size": p.get("ring_size", 0)}

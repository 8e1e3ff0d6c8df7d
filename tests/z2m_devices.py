"""Real zigbee2mqtt device lists for the tests, made at test time from the pinned npm package
zigbee-herdsman-converters (tools/z2m, installed by scripts/bootstrap with `npm ci`).

`bridge_devices(friendly=model, ...)` runs tools/z2m/dump-devices.mjs, which finds each model's definition the way
zigbee2mqtt does and prints the `bridge/devices` message zigbee2mqtt would publish for those devices (the
coordinator first, then one device per model, ieee addresses 0x00124b00000000NN in order). Nothing is committed:
the exposes are whatever the pinned package defines.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TOOL_DIR = REPO / "tools" / "z2m"
SCRIPT = TOOL_DIR / "dump-devices.mjs"
PACKAGE = TOOL_DIR / "node_modules" / "zigbee-herdsman-converters" / "package.json"

# The devices the bridge tests use: a dimmable white-spectrum bulb, a colour bulb, a metering plug, a thermostatic
# radiator valve, a lock, a roller blind, a fan with a light, a temperature/humidity sensor and a water valve.
MODELS: dict[str, str] = {
    "bulb": "LED1545G12",  # IKEA TRADFRI E27 white spectrum, brightness and colour temperature
    "hue_bulb": "9290012573A",  # Philips Hue white and colour ambiance (xy and colour temperature)
    "plug": "SP 120",  # Innr smart plug with power metering
    "radiator": "014G2461",  # Danfoss Ally thermostatic radiator valve
    "front_door": "YRD226HA2619",  # Yale lock
    "blind": "E1757",  # IKEA FYRTUR roller blind (position)
    "ceiling_fan": "99432",  # Hampton Bay fan and light
    "hallway_climate": "WSDCGQ11LM",  # Aqara temperature, humidity and pressure sensor
    "garden_valve": "SWV-ZFE",  # SONOFF water valve: a switch to zigbee2mqtt; its exposes are a function
}


class Z2mToolError(RuntimeError):
    """tools/z2m is not installed or its script failed."""


def bridge_devices(**models: str) -> bytes:
    """The `bridge/devices` payload for these friendly names and models (all of MODELS when none are given)."""
    chosen = models or MODELS
    return _run(tuple(chosen.items()))


def device_list(**models: str) -> list[dict[str, Any]]:
    """The same, parsed."""
    parsed: list[dict[str, Any]] = json.loads(bridge_devices(**models))
    return parsed


@cache
def _run(pairs: tuple[tuple[str, str], ...]) -> bytes:
    node = shutil.which("node")
    if node is None or not PACKAGE.is_file():
        raise Z2mToolError(f"zigbee-herdsman-converters is not installed under {TOOL_DIR} (or node is missing): "
                           "run scripts/bootstrap (npm ci in tools/z2m)")
    done = subprocess.run([node, str(SCRIPT), *(f"{name}={model}" for name, model in pairs)], cwd=TOOL_DIR,
                          capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        raise Z2mToolError(f"dump-devices.mjs failed ({done.returncode}): {done.stderr.decode(errors='replace')}")
    return done.stdout.strip()


def package_version() -> str:
    version: str = json.loads(PACKAGE.read_text())["version"]
    return version


def changed(devices: list[dict[str, Any]], friendly: str, prop: str, **fields: Any) -> list[dict[str, Any]]:
    """A copy of a device list in which the expose (or composite feature) `prop` of device `friendly` has these
    fields changed, e.g. `changed(devices, "bulb", "color_temp", value_max=500)` for a wider range: what a newer
    converter version or an edited external converter would announce."""
    result = copy.deepcopy(devices)
    entry = next(d for d in result if d.get("friendly_name") == friendly)
    found = [e for e in _walk(entry["definition"]["exposes"]) if e.get("property") == prop]
    if not found:
        raise KeyError(f"{friendly} has no expose {prop}")
    for expose in found:
        expose.update(fields)
    return result


def _walk(exposes: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for expose in exposes:
        yield expose
        yield from _walk(expose.get("features") or [])

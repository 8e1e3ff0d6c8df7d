"""The allow-list: which action kinds exist and which value types each may take.

A device can shape its own parameters (values, ranges, steps), but it can
never introduce an action kind or a value type that is not listed here: such a
contract is refused. Every action sets a target state, so repeating it is
harmless; there is no toggle. Momentary actions (feed, dispense, pack) are
counters with a target total, which keeps them idempotent too.
"""

from __future__ import annotations

from typing import Literal, get_args

ValueType = Literal["bool", "enum", "number", "color", "counter"]
ActionKind = Literal[
    "set_state",
    "set_level",
    "set_mode",
    "set_value",
    "set_position",
    "set_color",
    "set_version",
    "feed",
    "dispense",
    "pack",
]

ACTION_TYPES: dict[str, frozenset[str]] = {
    "set_state": frozenset({"bool"}),
    "set_level": frozenset({"enum"}),
    "set_mode": frozenset({"enum"}),
    "set_value": frozenset({"number"}),
    "set_position": frozenset({"number"}),
    "set_color": frozenset({"color"}),
    # Firmware updates choose among versions the firmware itself lists.
    "set_version": frozenset({"enum"}),
    "feed": frozenset({"counter"}),
    "dispense": frozenset({"counter"}),
    "pack": frozenset({"counter"}),
}

assert set(ACTION_TYPES) == set(get_args(ActionKind)), "allow-list and ActionKind must name the same kinds"

COLOR_PATTERN = r"^#[0-9a-f]{6}$"

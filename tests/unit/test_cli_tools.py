"""`corral tools --device D` lists what can act on D: the shared tools and D's own, not every device's tools."""

from __future__ import annotations

from typing import Any

from corral.cli.mcp import tools_for_device


def _tool(name: str, device_ids: list[str] | None = None, **hints: bool) -> dict[str, Any]:
    properties = {"device_id": {"type": "string", "enum": device_ids}} if device_ids is not None else {}
    return {"name": name, "inputSchema": {"type": "object", "properties": properties}, "annotations": hints}


TOOLS = [
    _tool("iot.list_devices", readOnlyHint=True),
    _tool("iot.control", ["home/kitchen-light", "home/front-lock"], destructiveHint=True),
    _tool("iot.set_alias", ["home/front-lock"]),
    _tool("kitchen-light.power.set_state", idempotentHint=True),
    _tool("front-lock.locked.set_state", destructiveHint=True),
]
OWNERS = {"kitchen-light.power.set_state": "home/kitchen-light", "front-lock.locked.set_state": "home/front-lock"}


def test_a_device_gets_the_shared_tools_that_may_name_it_and_its_own_only() -> None:
    rows = tools_for_device(TOOLS, OWNERS, "home/kitchen-light")
    assert rows == [("iot.list_devices", "read-only"), ("iot.control", "destructive"),
                    ("kitchen-light.power.set_state", "idempotent")]


def test_the_other_device_gets_its_own_tools_in_turn() -> None:
    names = [name for name, _ in tools_for_device(TOOLS, OWNERS, "home/front-lock")]
    assert names == ["iot.list_devices", "iot.control", "iot.set_alias", "front-lock.locked.set_state"]

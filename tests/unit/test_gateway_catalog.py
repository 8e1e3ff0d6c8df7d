"""One caller's tools as objects (gateway/toolset.catalog): the listed ones in tools/list order, the per-device ones
callable by name whether listed or not, each definition exactly what tools/list shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corral.gateway.access import Access
from corral.gateway.tools.control import Control, DeviceTool
from corral.gateway.toolset import Grants, catalog, device_tools, fixed_tools
from corral.gateway.visible import VisibleDevice
from tests.unit.test_gateway_exposure import seen


@dataclass
class View:
    """What toolset.catalog reads of a CallerView."""

    devices: list[VisibleDevice]
    namespaces: frozenset[str]
    device_tools_on: bool = False
    memo: dict[str, Any] = field(default_factory=dict)
    access: Access = field(default_factory=Access)  # no rights on Rules: no iot.rules.* tools

    def visible(self) -> list[VisibleDevice]:
        return self.devices

    def grants(self) -> Grants:
        return Grants(self.namespaces)

    def annotatable(self) -> list[VisibleDevice]:
        return self.devices


def test_the_catalog_lists_the_fixed_tools_and_finds_device_tools_only_by_name() -> None:
    devices = [seen("kitchen", {"read", "listen", "write"}), seen("porch", {"read"})]
    view = View(devices, frozenset({"home"}))
    tools = catalog(view)
    assert tools.definitions() == fixed_tools(devices, Grants(frozenset({"home"})), devices)
    assert isinstance(tools.find("iot.control"), Control) and tools.find("iot.nothing") is None
    name = next(iter(device_tools(devices, Grants(frozenset({"home"})))))
    assert name not in tools.listed and isinstance(tools.find(name), DeviceTool)
    assert catalog(view) is tools, "kept in the view's memo until it is cleared"
    view.memo.clear()
    listed = catalog(View(devices, frozenset({"home"}), device_tools_on=True))
    assert name in listed.listed and listed.definitions()[-1]["name"] in listed.device


def test_a_caller_that_sees_nothing_has_no_tool() -> None:
    tools = catalog(View([], frozenset({"home"})))
    assert tools.definitions() == [] and tools.find("iot.list_devices") is None

"""An Intent's target apply over a stale copy of the Device: no other Intent's field is lost or reverted.

The API server is played by `Server`, just the two rules the apply relies on: a resourceVersion precondition,
and server-side apply replacing the whole set of fields one manager owns. The integration test of the same
guarantee against the real API server is in tests/integration/test_concurrency.py.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from corral.reconcile.kube import StaleVersion
from corral.reconcile.targets import TargetApplier, intent_target, owned_target


class Server:
    def __init__(self) -> None:
        self.device: dict[str, Any] = {
            "metadata": {"namespace": "home", "name": "lamp", "resourceVersion": "1", "generation": 1,
                         "managedFields": []},
            "spec": {"deviceId": "lamp", "target": {}},
        }
        self.applies = 0

    def copy(self) -> dict[str, Any]:
        return copy.deepcopy(self.device)

    async def apply_intent_target(self, namespace: str, device: str, target: dict[str, Any], intent: str,
                                  resource_version: str) -> dict[str, Any]:
        meta = self.device["metadata"]
        if resource_version != meta["resourceVersion"]:
            raise StaleVersion("the object has been modified; please apply your changes to the latest version")
        self.applies += 1
        before = owned_target(self.device)
        current = self.device["spec"]["target"]
        # Server-side apply: fields the manager owned and no longer sends are removed.
        self.device["spec"]["target"] = {**{k: v for k, v in current.items() if k not in before}, **target}
        meta["managedFields"] = [{"manager": "corral-intents", "operation": "Apply",
                                  "fieldsV1": {"f:spec": {"f:target": {f"f:{k}": {} for k in target}}}}]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        meta["generation"] += 1
        return self.copy()

    async def get_device(self, namespace: str, name: str) -> dict[str, Any]:
        return self.copy()


def test_an_apply_computed_from_a_stale_copy_is_refused_and_computed_again() -> None:
    server = Server()
    applier = TargetApplier(server)
    stale = server.copy()  # what a watch cache may still hold while the next Intent runs

    async def scenario() -> None:
        await applier.apply(server.copy(), "power", True, "power-on")
        await applier.apply(stale, "brightness", 50, "dim-50")  # from before power-on

    asyncio.run(scenario())
    assert intent_target(stale, "brightness", 50) == {"brightness": 50}, "applied as computed, power would be lost"
    assert server.device["spec"]["target"] == {"power": True, "brightness": 50}
    assert applier.stale == 1 and server.applies == 2


def test_a_stale_copy_never_reverts_a_newer_value_of_another_intent() -> None:
    server = Server()
    applier = TargetApplier(server)

    async def scenario() -> None:
        await applier.apply(server.copy(), "power", True, "power-on")
        seen_then = server.copy()  # power: true
        await applier.apply(server.copy(), "power", False, "power-off")
        await applier.apply(seen_then, "brightness", 20, "dim-20")

    asyncio.run(scenario())
    assert server.device["spec"]["target"] == {"power": False, "brightness": 20}


def test_a_device_that_keeps_changing_ends_in_a_clear_error_not_a_blind_write() -> None:
    class Busy(Server):
        async def get_device(self, namespace: str, name: str) -> dict[str, Any]:
            body = self.copy()
            self.device["metadata"]["resourceVersion"] = str(int(self.device["metadata"]["resourceVersion"]) + 1)
            return body  # always one version behind by the time it is used

    server = Busy()
    stale = asyncio.run(server.get_device("home", "lamp"))
    with pytest.raises(StaleVersion, match="changed under each of 3 attempts"):
        asyncio.run(TargetApplier(server, attempts=3).apply(stale, "power", True, "power-on"))
    assert server.applies == 0

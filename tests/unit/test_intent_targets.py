"""An Intent's target apply over a stale copy of the Device: no other Intent's field is lost or reverted, and a
field a person took over is never taken back.

The API server is played by `Server`: just the server-side apply rules the apply relies on (the set of fields
one manager owns is replaced whole; a field another manager owns with another value is a conflict). The same
guarantee against the real API server, with Intents created at once, is tests/integration/test_concurrency.py.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from corral.kube.objects import FieldConflict
from corral.reconcile.devices.targets import TargetApplier, intent_target


class Server:
    def __init__(self) -> None:
        self.device: dict[str, Any] = {
            "metadata": {"namespace": "home", "name": "lamp", "uid": "u1", "resourceVersion": "1", "generation": 1,
                         "managedFields": []},
            "spec": {"deviceId": "lamp", "target": {}},
        }
        self.applies = 0

    def copy(self) -> dict[str, Any]:
        return copy.deepcopy(self.device)

    def owners(self) -> dict[str, str]:
        return {name.removeprefix("f:"): entry["manager"] for entry in self.device["metadata"]["managedFields"]
                for name in entry["fieldsV1"]["f:spec"]["f:target"]}

    def _bump(self) -> dict[str, Any]:
        meta = self.device["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        meta["generation"] += 1
        return self.copy()

    def _own(self, manager: str, fields: list[str]) -> None:
        entries = [e for e in self.device["metadata"]["managedFields"] if e["manager"] != manager]
        for entry in entries:  # a field has one owner here: the last to apply it with force
            entry["fieldsV1"]["f:spec"]["f:target"] = {
                k: v for k, v in entry["fieldsV1"]["f:spec"]["f:target"].items() if k.removeprefix("f:") not in fields}
        entries.append({"manager": manager, "operation": "Apply",
                        "fieldsV1": {"f:spec": {"f:target": {f"f:{k}": {} for k in fields}}}})
        self.device["metadata"]["managedFields"] = entries

    async def apply_intent_target(self, namespace: str, device: str, target: dict[str, Any], intent: str
                                  ) -> dict[str, Any]:
        current, owners = self.device["spec"]["target"], self.owners()
        taken = [k for k, v in target.items() if owners.get(k, "corral-intents") != "corral-intents"
                 and current.get(k) != v]
        if taken:
            raise FieldConflict(f"conflict with \"kubectl\": .spec.target.{taken[0]}")
        self.applies += 1
        mine = [k for k, owner in owners.items() if owner == "corral-intents"]
        self.device["spec"]["target"] = {**{k: v for k, v in current.items() if k not in mine}, **target}
        self._own("corral-intents", [k for k in target if owners.get(k, "corral-intents") == "corral-intents"])
        return self._bump()

    def person_applies(self, field: str, value: Any) -> None:
        """`kubectl apply --server-side --force-conflicts` of one target field."""
        self.device["spec"]["target"][field] = value
        self._own("kubectl", [field])
        self._bump()

    async def get_device(self, namespace: str, name: str) -> dict[str, Any]:
        return self.copy()


def test_an_apply_given_a_stale_copy_keeps_the_field_another_intent_set() -> None:
    server = Server()
    applier = TargetApplier(server)
    stale = server.copy()  # what a lagging watch cache still holds while the next Intent runs

    async def scenario() -> None:
        await applier.apply(server.copy(), "power", True, "power-on")
        await applier.apply(stale, "brightness", 50, "dim-50")  # handed the copy from before power-on

    asyncio.run(scenario())
    assert intent_target(stale, "brightness", 50) == {"brightness": 50}, "computed from that copy, power would go"
    assert server.device["spec"]["target"] == {"power": True, "brightness": 50}


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


def test_a_field_a_person_took_over_is_computed_out_and_never_taken_back() -> None:
    server = Server()
    applier = TargetApplier(server)

    async def scenario() -> None:
        await applier.apply(server.copy(), "power", True, "power-on")
        before = server.copy()
        server.person_applies("power", False)  # the controller has not seen this yet
        await applier.apply(before, "brightness", 30, "dim-30")

    asyncio.run(scenario())
    assert server.device["spec"]["target"] == {"power": False, "brightness": 30}
    assert server.owners() == {"power": "kubectl", "brightness": "corral-intents"}
    assert applier.recomputed == 1


def test_an_intent_for_a_field_a_person_owns_is_a_conflict() -> None:
    server = Server()
    server.person_applies("power", False)
    with pytest.raises(FieldConflict, match="kubectl"):
        asyncio.run(TargetApplier(server).apply(server.copy(), "power", True, "power-on"))
    assert server.device["spec"]["target"] == {"power": False} and server.applies == 0

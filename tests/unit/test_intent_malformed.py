"""An Intent the controller cannot read is said to be malformed on the Intent itself, once, and never decided;
one the API server stores with arguments the request model would refuse is decided as before, not refused here."""

from __future__ import annotations

import asyncio
from typing import Any

from corral.audit.decisions import DecisionIndex
from corral.kube.cache import Key
from corral.reconcile.intents.settings import IntentSettings
from corral.reconcile.intents.wiring import IntentController


class FakeKube:
    def __init__(self) -> None:
        self.statuses: list[tuple[str, str, str, dict[str, Any], str]] = []

    async def apply_status(self, plural: str, namespace: str, name: str, kind: str, status: dict[str, Any],
                           reason: str) -> dict[str, Any]:
        self.statuses.append((plural, namespace, name, status, reason))
        return {"metadata": {"namespace": namespace, "name": name}, "status": status}


class FakeRecorder:
    def __init__(self) -> None:
        self.events: list[tuple[Any, str, str, str, str]] = []

    def post(self, regarding: Any, reason: str, action: str, note: str, type_: str = "Normal",
             related: Any = None) -> None:
        self.events.append((regarding, reason, action, note, type_))


class NoDevices:
    def view(self, namespace: str, name: str) -> None:
        return None


def intent_body(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "corral.dev/v1alpha1", "kind": "Intent",
            "metadata": {"namespace": "home", "name": name, "uid": f"uid-{name}", "resourceVersion": "7",
                         "generation": 1, "creationTimestamp": "2026-12-01T10:00:00Z"},
            "spec": {"device": "kitchen-light", "actuator": "power", "action": "set_state", "params": {"value": True},
                     "requester": "system:serviceaccount:home:agent", "reason": "test", **spec}}


def controller(kube: FakeKube, recorder: FakeRecorder) -> IntentController:
    return IntentController(IntentSettings(), kube, object(), recorder, NoDevices(), object(),
                            DecisionIndex())


def test_a_malformed_intent_gets_a_condition_and_a_warning_once_and_is_not_decided() -> None:
    async def scenario() -> None:
        kube, recorder = FakeKube(), FakeRecorder()
        intents = controller(kube, recorder)
        body = intent_body("broken")
        del body["spec"]["requester"]
        key: Key = ("home", "broken")
        intents.on_intent_event("ADDED", body)
        assert intents.intents.get(key) is None  # nothing acts on what cannot be read
        assert await intents.reconciler.reconcile(key) == await intents.reconciler.reconcile(("home", "other"))
        [(plural, namespace, name, status, reason)] = kube.statuses
        assert (plural, namespace, name, reason) == ("intents", "home", "broken", "malformed")
        [condition] = status["conditions"]
        assert condition["type"] == "Valid" and condition["status"] == "False" and condition["reason"] == "Malformed"
        assert "spec.requester" in condition["message"] and "phase" not in status
        [(regarding, event_reason, _, note, type_)] = recorder.events
        assert (regarding.kind, regarding.name, event_reason, type_) == ("Intent", "broken", "Malformed", "Warning")
        assert note == condition["message"]
        # Its own write comes back as a watch event: said already, so nothing is written or told again.
        intents.on_intent_event("MODIFIED", {**body, "metadata": {**body["metadata"], "resourceVersion": "8"},
                                             "status": status})
        await intents.reconciler.reconcile(key)
        assert len(kube.statuses) == 1 and len(recorder.events) == 1
        # Deleted: forgotten.
        intents.on_intent_event("DELETED", body)
        await intents.reconciler.reconcile(key)
        assert len(kube.statuses) == 1

    asyncio.run(scenario())


def test_arguments_the_decision_judges_are_not_malformed() -> None:
    async def scenario() -> None:
        intents = controller(FakeKube(), FakeRecorder())
        for body in (intent_body("long-alias", action="set_alias", actuator="alias", params={"value": "x" * 200}),
                     intent_body("wrong-field", action="set_alias", actuator="power", params={"value": "kitchen"}),
                     intent_body("no-ttl", action="acquire", actuator="lease", params={"value": 0}),
                     intent_body("object", params={"value": {"on": True}})):
            intents.on_intent_event("ADDED", body)
            stored = intents.intents.get(("home", body["metadata"]["name"]))
            assert stored is not None and stored.spec.params is not None
            assert stored.spec.params.value == body["spec"]["params"]["value"]

    asyncio.run(scenario())

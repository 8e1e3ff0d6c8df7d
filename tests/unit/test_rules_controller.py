"""The Rule controller's parts without a cluster: its Intents' names, which Intent a Rule made (a label alone proves
nothing), the readings kept for Rules of devices another replica owns, and when a status is worth writing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import kubernetes
import pytest

from corral.api.pause import Paused
from corral.api.rule import RULE_LABEL, RuleStatus
from corral.audit.log import AuditLog
from corral.decide.approvals import People
from corral.kube.access import AccessReviews
from corral.kube.events import EventRecorder
from corral.kube.objects import Kube
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.port import DeviceView
from corral.reconcile.intents.facts import StoredIntent
from corral.reconcile.rules.acting import Acting, fresh_token, intent_name, label_value
from corral.reconcile.rules.controller import Rules
from corral.reconcile.rules.inputs import MAX_KEPT_METRICS, KeptReadings, RuleInputs
from corral.reconcile.rules.revisions import Revisions
from corral.reconcile.rules.status import worth_writing

NS, UID = "home", "0a1b2c3d-0000-0000-0000-000000000000"
SA = f"system:serviceaccount:{NS}:leak-rule"
NOW = datetime(2026, 12, 3, 7, 0, tzinfo=UTC)


def rule_body(name: str = "leak", intents: list[str] | None = None, author: str = "alice") -> dict[str, Any]:
    status = {"firings": 1, "intents": [{"name": n, "device": "valve", "createdAt": "2026-12-03T07:00:00Z"}
                                        for n in intents or []]}
    return {"apiVersion": "corral.dev/v1alpha1", "kind": "Rule",
            "metadata": {"name": name, "namespace": NS, "uid": UID, "generation": 1, "resourceVersion": "5"},
            "spec": {"serviceAccountName": "leak-rule", "author": author, "inputs": ["probe"],
                     "condition": 'readings["probe"]["wet"]', "actions": [
                         {"device": "valve", "actuator": "open", "action": "set_state", "value": False}],
                     "reason": "a leak"},
            "status": status}


def intent(name: str, rule: str | None = "leak", requester: str = SA) -> StoredIntent:
    labels = {RULE_LABEL: rule} if rule is not None else {}
    return StoredIntent.model_validate({
        "apiVersion": "corral.dev/v1alpha1", "kind": "Intent",
        "metadata": {"name": name, "namespace": NS, "uid": "u", "labels": labels},
        "spec": {"device": "valve", "actuator": "open", "action": "set_state", "params": {"value": False},
                 "reason": "a leak", "requester": requester}})


def controller(view_of: Any = lambda namespace, name: None) -> Rules:
    kube = Kube(kubernetes.client.Configuration())
    people, no_pause = People(), (lambda namespace: cast(Paused | None, None))
    audit, recorder = cast(AuditLog, None), cast(EventRecorder, None)
    return Rules(kube, (NS,), audit, recorder, people, RuleInputs(DeviceCache(), view_of),
                 Acting(kube, AccessReviews(kube), lambda namespace, name: None), Revisions(kube, audit, people),
                 paused=no_pause, rules_paused=no_pause, leading=lambda: True)


def test_intent_names_carry_a_fresh_random_token_and_stay_valid_and_apart_per_rule() -> None:
    tokens = {fresh_token() for _ in range(50)}
    assert len(tokens) == 50 and all(len(t) == 16 and t.isalnum() and t == t.lower() for t in tokens)
    assert intent_name("leak", 3, 0, "abcdefghijklmnop") == "leak-3-0-abcdefghijklmnop"
    long = "a" * 200
    name = intent_name(long, 12, 1, "abcdefghijklmnop")
    assert len(name) <= 63 and name.endswith("-12-1-abcdefghijklmnop")
    assert name != intent_name("a" * 199, 12, 1, "abcdefghijklmnop")
    assert len(label_value(long)) == 63 and label_value("leak") == "leak"


def test_only_an_intent_the_rules_status_lists_by_its_service_account_is_the_rules() -> None:
    rules = controller()
    rules.objects.upsert(rule_body(intents=["leak-1-0-abcdefghijklmnop"]))
    origin = rules.origin(intent("leak-1-0-abcdefghijklmnop"))
    assert origin is not None and (origin.name, origin.agent_written) == ("leak", False)
    assert rules.origin(intent("leak-1-0-abcdefghijklmnop", rule=None)) is None  # no label
    assert rules.origin(intent("forged", rule="leak")) is None  # a label alone proves nothing
    assert rules.origin(intent("leak-1-0-abcdefghijklmnop", requester=f"system:serviceaccount:{NS}:agent")) is None
    assert rules.origin(intent("leak-1-0-abcdefghijklmnop", rule="other")) is None


def test_an_agent_written_rule_is_said_so_to_the_intent_pipeline() -> None:
    rules = controller()
    rules.objects.upsert(rule_body(intents=["leak-1-0-abcdefghijklmnop"], author=f"system:serviceaccount:{NS}:agent"))
    origin = rules.origin(intent("leak-1-0-abcdefghijklmnop"))
    assert origin is not None and origin.agent_written


def test_kept_readings_take_the_newest_sample_with_this_replicas_receive_time_and_are_bounded() -> None:
    kept = KeptReadings(clock=lambda: 1000.0)
    samples = [{"metric": f"m{i}", "value": i, "ts": 5} for i in range(MAX_KEPT_METRICS + 10)]
    assert kept.keep("probe-1", json.dumps({"ts": 5, "samples": samples}).encode())
    assert len(kept.latest["probe-1"]) == MAX_KEPT_METRICS
    assert kept.latest["probe-1"]["m0"].received_ms == 1_000_000.0
    assert not kept.keep("probe-1", b"not json")


@pytest.mark.parametrize("heard_before", [False, True])
def test_a_device_another_replica_owns_is_read_from_its_status_and_the_kept_readings(heard_before: bool) -> None:
    """Also one this replica heard while it owned it: what it heard then is not news any more."""
    cache = DeviceCache()
    body = {"apiVersion": "corral.dev/v1alpha1", "kind": "Device",
            "metadata": {"name": "probe", "namespace": NS, "uid": "d", "resourceVersion": "1",
                         "creationTimestamp": "2026-12-03T06:00:00Z"},
            "spec": {"deviceId": "probe-1"}, "status": {"online": True, "reported": {"firmware": "v1"}}}
    cache.upsert(body)
    device = cache.device((NS, "probe"))

    def view_of(namespace: str, name: str) -> DeviceView | None:
        return DeviceView(body, "probe-1", bound=True, known=heard_before, online=False, device=device)

    inputs = RuleInputs(cache, view_of, owns=lambda device_id: False)
    inputs.kept.keep("probe-1", json.dumps({"ts": 1, "samples": [{"metric": "wet", "value": True, "ts": 1}]}).encode())
    facts = inputs.facts(NS, ["probe"])["probe"]
    assert facts.exists and facts.online and facts.reported == {"firmware": "v1"}
    assert facts.latest is not None and facts.latest["wet"].value is True


def test_a_status_is_written_for_what_readers_act_on_and_otherwise_at_most_every_30_s() -> None:
    old = RuleStatus(state="Holding", message="held 0.5 s", last_evaluated=NOW)
    assert not worth_writing(old.model_copy(update={"message": "held 0.9 s"}), old, NOW + timedelta(seconds=1))
    assert worth_writing(old.model_copy(update={"message": "held 31 s"}), old, NOW + timedelta(seconds=31))
    assert worth_writing(old.model_copy(update={"state": "Fired"}), old, NOW + timedelta(seconds=1))
    assert not worth_writing(old, old, NOW + timedelta(seconds=60))

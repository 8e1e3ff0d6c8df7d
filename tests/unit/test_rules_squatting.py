"""A Rule's Intents cannot be squatted, and its author is checked against the trusted contract (issue 41, findings 4
and 8), without a cluster: the API server is a fake that keeps the Rule and the Intents and answers reviews from a
table, so the whole reconcile runs (audit record, status writes, creations) and what it wrote is read back.

The real plane replays both attacks in tests/integration/test_rules.py."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import kubernetes
import pytest

from corral.api.pause import Paused
from corral.api.rule import RULE_LABEL, Rule, RuleStatus
from corral.audit.log import AuditLog
from corral.contract.model import Contract
from corral.decide.approvals import People
from corral.decide.evidence import Received
from corral.decide.rules import InputFacts
from corral.kube.access import AccessReviews
from corral.kube.client import ApiError
from corral.kube.events import EventRecorder
from corral.kube.objects import Kube
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.devices.port import DeviceView
from corral.reconcile.rules.acting import Acting, Holder, intent_body, intent_name, taken_by
from corral.reconcile.rules.controller import Rules
from corral.reconcile.rules.inputs import RuleInputs
from corral.reconcile.rules.making import NAME_ATTEMPTS, SQUATTED
from corral.reconcile.rules.revisions import Revisions
from corral.reconcile.rules.status import Outcome, with_outcomes
from corral.reconcile.rules.wiring import TrustedContracts

NS, UID = "home", "0a1b2c3d-0000-0000-0000-000000000000"
SA = f"system:serviceaccount:{NS}:leak-rule"
AGENT = f"system:serviceaccount:{NS}:agent"
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
VALVE = Contract.model_validate({**json.loads(Path("firmware/devices/water_valve.json").read_text()),
                                 "device_id": "valve-1"})
OPEN = {"device": "valve", "actuator": "open", "action": "set_state", "value": False}
FIRMWARE = {"device": "valve", "actuator": "firmware", "action": "set_version", "value": "1.3.0"}


def rule_body(action: dict[str, Any] = OPEN, author: str = "alice") -> dict[str, Any]:
    return {"apiVersion": "corral.dev/v1alpha1", "kind": "Rule",
            "metadata": {"name": "leak", "namespace": NS, "uid": UID, "generation": 1, "resourceVersion": "5"},
            "spec": {"serviceAccountName": "leak-rule", "author": author, "inputs": ["probe"], "for": "0s",
                     "condition": 'readings["probe"]["wet"]', "actions": [action], "reason": "a leak"}}


class FakeApi:
    """The API server as the Rule controller uses it: the Rule's status, Intents (409 for a taken name; `race`
    creates are beaten by an agent's Intent under the same name) and SubjectAccessReviews from `allowed`."""

    def __init__(self, rule: dict[str, Any], allowed: set[tuple[str, str]]) -> None:
        self.rule, self.allowed = rule, allowed
        self.intents: dict[str, dict[str, Any]] = {}
        self.race = 0  # this many of the next creates find their name taken by an agent the moment before
        self.created: list[str] = []

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        if path.endswith("/status"):
            version = str(int(self.rule["metadata"]["resourceVersion"]) + 1)
            self.rule = {**self.rule, "metadata": {**self.rule["metadata"], "resourceVersion": version},
                         "status": body["status"]}
            return copy.deepcopy(self.rule)
        if "subjectaccessreviews" in path:
            attributes = body["spec"]["resourceAttributes"]
            return {"status": {"allowed": (attributes["verb"], attributes.get("name")) in self.allowed}}
        if path.endswith("/intents") and method == "POST":
            return self._create(body)
        if "/intents/" in path:
            name = path.rsplit("/", 1)[1]
            if name not in self.intents:
                raise ApiError(404, f"intents {name} not found")
            return copy.deepcopy(self.intents[name])
        if "approvalgrants" in path:
            return {"items": []}
        raise AssertionError(f"unexpected {method} {path}")

    def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        if self.race > 0:
            self.race -= 1
            self.intents[name] = squatter(name)
        if name in self.intents:
            raise ApiError(409, f'intents "{name}" already exists')
        self.intents[name] = body
        self.created.append(name)
        return body


def squatter(name: str, labelled: bool = True) -> dict[str, Any]:
    """The agent's Intent under the Rule's name: the same device, actuator and value, even the label."""
    return {"metadata": {"name": name, "namespace": NS, "labels": {RULE_LABEL: "leak"} if labelled else {}},
            "spec": {"device": "valve", "actuator": "open", "action": "set_state", "params": {"value": False},
                     "requester": AGENT, "reason": "mine"}}


@dataclass
class Told:
    records: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)


class FakeAudit:
    def __init__(self, told: Told) -> None:
        self.told = told

    async def append(self, kind: str, subject: str, data: dict[str, Any], **_: Any) -> int:
        self.told.records.append((kind, dict(data)))
        return len(self.told.records)

    async def seal(self, kind: str, subject: str, data: dict[str, Any], **_: Any) -> Any:
        from corral.audit.log import Sealed
        return Sealed(await self.append(kind, subject, data), "0" * 64)


class FakeRecorder:
    def __init__(self, told: Told) -> None:
        self.told = told

    def post(self, ref: Any, reason: str, action: str, note: str, type_: str = "Normal", **_: Any) -> None:
        self.told.events.append((type_, reason, note))


def wet() -> dict[str, InputFacts]:
    now_ms = datetime.now(UTC).timestamp() * 1000
    return {"probe": InputFacts("probe", True, True, {}, {"wet": Received(1, now_ms, True)})}


def rules_with(api: FakeApi, contract: Contract | None, told: Told) -> Rules:
    kube = Kube(kubernetes.client.Configuration())
    kube.api = cast(Any, api)
    people, no_pause = People(), (lambda namespace: cast(Paused | None, None))
    audit, recorder = cast(AuditLog, FakeAudit(told)), cast(EventRecorder, FakeRecorder(told))
    rules = Rules(kube, (NS,), audit, recorder, people, RuleInputs(DeviceCache(), lambda ns, name: None),
                  Acting(kube, AccessReviews(kube), lambda ns, name: contract), Revisions(kube, audit, people),
                  paused=no_pause, rules_paused=no_pause, leading=lambda: True)
    rules.inputs.facts = lambda namespace, names: wet()
    rules.objects.upsert(api.rule)
    return rules


def status_of(api: FakeApi) -> RuleStatus:
    return Rule.model_validate(api.rule).status or RuleStatus()


def condition(status: RuleStatus, kind: str) -> tuple[str, str, str]:
    found = next(c for c in status.conditions if c.type == kind)
    return found.status, found.reason, found.message


ALLOWED = {("impersonate", "leak-rule"), ("write", "valve")}


def test_intent_names_are_valid_unguessable_and_bounded() -> None:
    names = {intent_name("leak", 3, 0, f"{i:016d}") for i in range(3)}
    assert len(names) == 3 and all(NAME.match(n) and n.startswith("leak-3-0-") for n in names)
    body = intent_body(Rule.model_validate(rule_body()), "x", Rule.model_validate(rule_body()).spec.actions[0])
    assert body["metadata"]["labels"] == {RULE_LABEL: "leak"} and body["spec"]["requester"] == SA
    long = intent_name("a" * 200, 12, 1, "abcdefghijklmnop")
    assert len(long) <= 63 and long.endswith("-12-1-abcdefghijklmnop") and NAME.match(long)


def test_only_the_rules_own_intent_under_its_name_is_its_own() -> None:
    rule = Rule.model_validate(rule_body())
    own = intent_body(rule, "leak-1-0-x", rule.spec.actions[0])
    assert taken_by(copy.deepcopy(own), own) is None
    held = taken_by(squatter("leak-1-0-x"), own)
    assert held == Holder(AGENT, "an Intent on devices/valve, actuator open, with the Rule's label")
    other_value = copy.deepcopy(own)
    other_value["spec"]["params"] = {"value": True}
    assert taken_by(other_value, own) is not None, "the ServiceAccount's, but not this action"
    unlabelled = copy.deepcopy(own)
    unlabelled["metadata"]["labels"] = {}
    assert taken_by(unlabelled, own) is not None


def test_an_outcome_counts_only_from_an_intent_the_rules_service_account_asked_for() -> None:
    entry = {"name": "leak-1-0-x", "device": "valve", "createdAt": "2026-12-03T07:00:00Z", "firing": 1, "action": 0}
    status = RuleStatus.model_validate({"firings": 1, "intents": [entry]})
    agents = {"leak-1-0-x": Outcome("EXECUTED", "", AGENT)}
    assert with_outcomes(status.intents, agents, SA)[0].code is None
    assert with_outcomes(status.intents, {"leak-1-0-x": Outcome("EXECUTED", "", SA)}, SA)[0].code == "EXECUTED"


def test_a_firing_whose_name_is_taken_reports_the_squatter_and_acts_under_a_fresh_name() -> None:
    """The race a watcher of the status could win: the name is taken between the status write and the create."""
    api, told = FakeApi(rule_body(), ALLOWED), Told()
    rules = rules_with(api, VALVE, told)
    api.race = 1  # the first name the Rule creates is taken the moment before
    asyncio.run(rules.reconcile((NS, "leak")))

    status = status_of(api)
    [mine] = api.created
    assert api.intents[mine]["spec"]["requester"] == SA, "the Rule's own Intent was made"
    [taken] = [n for n, body in api.intents.items() if body["spec"]["requester"] == AGENT]
    assert [e.name for e in status.intents] == [mine] and not status.intents[0].pending
    state, reason, message = condition(status, "IntentNames")
    assert (state, reason) == ("False", "IntentNameTaken") and AGENT in message and taken in message, message
    [(_, record)] = [(k, d) for k, d in told.records if k == SQUATTED]
    assert record["takenBy"] == AGENT and record["name"] == taken and record["instead"] == mine, record
    assert ("Warning", "IntentNameTaken", message) in told.events
    assert rules.origin(rules_intent(api, taken)) is None, "the squatter's Intent is never the Rule's"
    assert rules.origin(rules_intent(api, mine)) is not None


def rules_intent(api: FakeApi, name: str) -> Any:
    from corral.reconcile.intents.facts import StoredIntent
    return StoredIntent.model_validate({"apiVersion": "corral.dev/v1alpha1", "kind": "Intent",
                                        **{**api.intents[name], "metadata": {**api.intents[name]["metadata"],
                                                                             "uid": "u"}}})


@pytest.mark.parametrize("squatted", [False, True])
def test_after_a_crash_the_pending_name_is_made_once_or_replaced_when_somebody_took_it(squatted: bool) -> None:
    pending = {"name": "leak-1-0-abcdefghijklmnop", "device": "valve", "createdAt": "2026-12-03T07:00:00Z",
               "firing": 1, "action": 0, "pending": True}
    body = {**rule_body(), "status": {"firings": 1, "firedGeneration": 1, "lastFired": datetime.now(UTC).isoformat(),
                                      "intents": [pending]}}
    api, told = FakeApi(body, ALLOWED), Told()
    if squatted:
        api.intents[pending["name"]] = squatter(pending["name"])
    rules = rules_with(api, VALVE, told)
    asyncio.run(rules.reconcile((NS, "leak")))
    status = status_of(api)
    [made] = api.created
    assert (made == pending["name"]) is not squatted
    assert [e.name for e in status.intents if e.firing == 1] == [made] and not status.intents[0].pending
    assert condition(status, "IntentNames")[1] == ("IntentNameTaken" if squatted else "Made")
    assert [k for k, _ in told.records].count("rule.fired") == 0, "the crashed firing is carried out, not repeated"
    asyncio.run(rules.reconcile((NS, "leak")))
    assert len(api.created) == 1, "once"


def test_a_pending_intent_of_an_earlier_generation_is_dropped_not_made_from_a_spec_nobody_fired() -> None:
    pending = {"name": "leak-1-0-abcdefghijklmnop", "device": "valve", "createdAt": "2026-12-03T07:00:00Z",
               "firing": 1, "action": 0, "pending": True}
    body = {**rule_body(), "status": {"firings": 1, "firedGeneration": 1, "lastFired": datetime.now(UTC).isoformat(),
                                      "intents": [pending]}}
    body["metadata"]["generation"] = 2
    api, told = FakeApi(body, ALLOWED), Told()
    asyncio.run(rules_with(api, VALVE, told).reconcile((NS, "leak")))
    assert api.created == [] and status_of(api).intents == []
    assert any(reason == "NotMade" for _, reason, _ in told.events)


def test_an_action_that_needs_config_is_refused_to_a_write_only_author_and_an_unknown_contract_acts_for_nobody(
) -> None:
    """Finding 8: the verb is the trusted contract's, never `write` by default."""
    api, told = FakeApi(rule_body(FIRMWARE), ALLOWED), Told()
    asyncio.run(rules_with(api, None, told).reconcile((NS, "leak")))
    status = status_of(api)
    state, reason, message = condition(status, "ContractsKnown")
    assert (status.state, state, reason) == ("Refused", "False", "ContractUnknown") and "devices/valve" in message
    assert api.created == [] and status.firings == 0, "the old fallback checked write, which the author holds"

    rules = rules_with(api, VALVE, told)  # the contract known now (its status, or the device announced it)
    asyncio.run(rules.reconcile((NS, "leak")))
    status = status_of(api)
    assert (status.state, status.code) == ("Refused", "DENY_SCOPE") and "config on devices/valve" in status.message
    assert condition(status, "ContractsKnown")[1] == "Known" and api.created == []

    api.allowed = ALLOWED | {("config", "valve")}  # positive control: the author holds config
    rules.acting.access = AccessReviews(rules.kube)  # a fresh answer, as after the review's TTL
    asyncio.run(rules.reconcile((NS, "leak")))
    assert status_of(api).firings == 1 and len(api.created) == 1
    assert api.intents[api.created[0]]["spec"]["actuator"] == "firmware"


def test_the_trusted_contract_comes_from_the_devices_accepted_capability_when_this_replica_has_not_heard_it() -> None:
    cache = DeviceCache()
    device_body = {"apiVersion": "corral.dev/v1alpha1", "kind": "Device",
                   "metadata": {"name": "valve", "namespace": NS, "uid": "d", "resourceVersion": "1",
                                "creationTimestamp": "2026-12-03T06:00:00Z"},
                   "spec": {"deviceId": "valve-1"}, "status": {"acceptedCapability": "cap-1"}}
    cache.upsert(device_body)

    class Capabilities:
        @staticmethod
        def contract(name: str | None, device_id: str) -> Contract | None:
            return VALVE if (name, device_id) == ("cap-1", "valve-1") else None

    class Trust:
        capabilities = Capabilities()

        @staticmethod
        def effective(contract: Contract, device: Any) -> Contract:
            return contract

    held = DeviceView(device_body, "valve-1", True, True, contract=Contract.model_validate(
        {**VALVE.model_dump(), "actuators": []}), hold="a wider contract waits for a person")
    trusted = TrustedContracts(cache, cast(Any, Trust()), lambda ns, name: held)
    assert trusted(NS, "valve") is VALVE, "a held announcement is not trusted: the accepted one is"
    assert TrustedContracts(cache, cast(Any, Trust()), lambda ns, name: None)(NS, "valve") is VALVE
    assert TrustedContracts(cache, cast(Any, Trust()), lambda ns, name: None)(NS, "other") is None


def test_names_taken_again_and_again_leave_the_intent_pending_and_it_is_made_on_the_next_evaluation() -> None:
    api, told = FakeApi(rule_body(), ALLOWED), Told()
    rules = rules_with(api, VALVE, told)
    api.race = NAME_ATTEMPTS + 1
    asyncio.run(rules.reconcile((NS, "leak")))
    [entry] = status_of(api).intents
    assert entry.pending and api.created == [] and len(api.intents) == NAME_ATTEMPTS
    assert [k for k, _ in told.records].count(SQUATTED) == NAME_ATTEMPTS
    asyncio.run(rules.reconcile((NS, "leak")))  # the workqueue asks again (RETRY_S)
    [entry] = status_of(api).intents
    assert not entry.pending and api.created == [entry.name] and status_of(api).firings == 1

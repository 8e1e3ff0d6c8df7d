"""What guards or covers a Device never selects it by a label Corral derives (issue 41, finding 1): the models and the
CRD rule refuse such a selector, naming the label and why; an Interlock or a grant stored before that rule fails
closed in the controller.

The attack: an Interlock on `corral.dev/location: nursery` stopped guarding the nursery heater once an agent
renamed it "Garage" with iot.set_location (which needs only `annotate` and no approval).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from cel_expr_python import cel
from cel_expr_python.ext.ext_optional import ExtOptional
from cel_expr_python.ext.ext_strings import ExtStrings
from pydantic import ValidationError

from corral.api.crd import crd_for
from corral.api.grant import ApprovalGrant
from corral.api.interlock import Interlock
from corral.api.labels import DERIVED_LABELS, READ_STORED, refusal, selector_rules
from corral.api.locations import LOCATION_LABEL
from corral.api.rule import RULE_LABEL
from corral.client.bridge import DISCOVERED_LABEL
from corral.client.enroll import DEVICE_ID_LABEL, DEVICE_TYPE_LABEL
from corral.decide.grants import GrantView, why_not_covered
from corral.decide.interlocks import Rule, applies, compile_rule, evaluate, guards_device, selector_refused
from corral.decide.selectors import Requirement, Selector
from corral.kube.objects import Kube
from corral.reconcile.devices.cache import DeviceCache
from corral.reconcile.guards.interlocks import SELECTOR_ACCEPTED, Interlocks, rule_of
from corral.reconcile.shardlabels import SHARD_LABEL
from tests.unit.test_interlocks import device_body

HEATER_RULE = Rule(name="nursery-heat", condition="true", message="The nursery heater stays below 26 °C.",
                   selector=Selector({LOCATION_LABEL: "nursery"}), actuators=("target_temp",), values=(30,))
NOW = datetime(2026, 12, 1, 20, 0, tzinfo=UTC)
AGENT = "system:serviceaccount:home:agent"


def interlock(selector: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "corral.dev/v1alpha1", "kind": "Interlock",
            "metadata": {"name": "nursery-heat", "namespace": "home", "uid": "u-1", "resourceVersion": "5",
                         "generation": 1},
            "spec": {"guards": {"selector": selector, "actuators": ["target_temp"], "values": [30]},
                     "condition": "true", "message": HEATER_RULE.message}}


def grant(selector: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "corral.dev/v1alpha1", "kind": "ApprovalGrant", "metadata": {"name": "warm-kitchen"},
            "spec": {"grantor": "alice", "requester": AGENT, "selector": selector, "actuators": ["target_temp"],
                     "values": [22], "uses": 3, "expiresAt": "2026-12-02T00:00:00Z"}}


# ---- the vocabulary ---------------------------------------------------------------------------------------------

def test_every_label_corral_writes_is_in_its_own_domain_and_says_why_it_is_refused() -> None:
    written = [LOCATION_LABEL, SHARD_LABEL, RULE_LABEL, DISCOVERED_LABEL, DEVICE_ID_LABEL, DEVICE_TYPE_LABEL]
    assert sorted(written) == sorted(DERIVED_LABELS), "a label Corral writes is missing from api/labels.py"
    assert all(label.startswith("corral.dev/") for label in written)
    assert refusal(LOCATION_LABEL).startswith(
        "corral.dev/location is derived from the overlay location, which an agent may change with iot.set_location")
    assert "select them by a label only people set" in refusal("corral.dev/added-later")


# ---- admission: the models and the CRD rule -----------------------------------------------------------------------

@pytest.mark.parametrize("selector", [
    {"matchLabels": {"room": "nursery", LOCATION_LABEL: "nursery"}},
    {"matchExpressions": [{"key": LOCATION_LABEL, "operator": "In", "values": ["nursery"]}]},
])
@pytest.mark.parametrize("body", [interlock, grant])
def test_the_models_refuse_a_selector_on_the_location_naming_it_and_why(selector: dict[str, Any], body: Any) -> None:
    model = Interlock if body is interlock else ApprovalGrant
    with pytest.raises(ValidationError) as refused:
        model.model_validate(body(selector))
    said = str(refused.value)
    assert "the selector key corral.dev/location is derived from the overlay location, which an agent may change " \
           "with iot.set_location" in said and "a label only people set" in said, said
    # Positive control: a label only people set.
    model.model_validate(body({"matchLabels": {"room": "nursery"}}))


def test_an_object_stored_before_the_rule_is_read_as_it_is_under_the_stored_context() -> None:
    stored = Interlock.model_validate(interlock({"matchLabels": {SHARD_LABEL: "0"}}), context=READ_STORED)
    assert stored.spec.guards.selector is not None and stored.spec.guards.selector.label_keys() == [SHARD_LABEL]
    assert rule_of(interlock({"matchLabels": {SHARD_LABEL: "0"}})).selector == Selector({SHARD_LABEL: "0"})


def _cel(expression: str, selector: dict[str, Any]) -> Any:
    env = cel.NewEnv(variables={"self": cel.Type.Map(cel.Type.STRING, cel.Type.DYN)},
                     extensions=[ExtStrings(), ExtOptional()])
    return env.compile(expression).eval(data={"self": selector}).plain_value()


@pytest.mark.parametrize(("selector", "said"), [
    ({"matchLabels": {"room": "a", LOCATION_LABEL: "nursery"}}, f"the selector key {refusal(LOCATION_LABEL)}"),
    ({"matchExpressions": [{"key": "room", "operator": "Exists"}, {"key": SHARD_LABEL, "operator": "Exists"}]},
     f"the selector key {refusal(SHARD_LABEL)}"),
    ({"matchLabels": {"corral.dev/added-later": "x"}}, "a selector key is in the corral.dev/ label domain"),
    ({"matchExpressions": [{"key": "corral.dev/added-later", "operator": "Exists"}]}, "a selector key is in the"),
    ({"matchLabels": {"room": "nursery"}, "matchExpressions": [{"key": "corral.devices", "operator": "Exists"}]},
     None),
    ({}, None),
])
def test_the_crd_rules_refuse_what_the_model_refuses_naming_each_known_label(selector: dict[str, Any],
                                                                            said: str | None) -> None:
    failed = [rule for rule in selector_rules() if isinstance(rule, dict) and not _cel(str(rule["rule"]), selector)]
    assert [str(rule["message"]).startswith(said) for rule in failed] == ([] if said is None else [True]), failed


@pytest.mark.parametrize("kind", [Interlock, ApprovalGrant])
def test_both_kinds_carry_the_rule_in_their_generated_crd(kind: Any) -> None:
    text = str(crd_for(kind))
    assert all(str(rule["rule"]) in text for rule in selector_rules() if isinstance(rule, dict))


# ---- the controller: one stored before the rule fails closed -----------------------------------------------------

def test_an_interlock_on_a_derived_label_guards_every_device_of_its_namespace_and_forbids() -> None:
    # Wherever the agent moved the heater (or any other Device), the rule guards it for its actuators and values.
    for device, labels in (("nursery-heater", {LOCATION_LABEL: "garage"}), ("hall-ac", {})):
        assert guards_device(HEATER_RULE, device, labels) and applies(HEATER_RULE, device, labels, "target_temp", 30)
    assert not applies(HEATER_RULE, "hall-ac", {}, "target_temp", 22), "its values still bound it"
    assert not applies(HEATER_RULE, "hall-ac", {}, "mode", 30), "and its actuators"
    verdict = evaluate(compile_rule(HEATER_RULE), {}, {})  # the condition is plain true: it forbids anyway
    assert not verdict.holds and verdict.message.startswith(HEATER_RULE.message)
    assert "corral.dev/location is derived from the overlay location" in verdict.message
    assert "Until a person rewrites the selector" in verdict.message
    expression = replace(HEATER_RULE, selector=Selector(requirements=(Requirement(SHARD_LABEL, "Exists"),)))
    assert selector_refused(expression) is not None and "corral.dev/shard is the shard" in str(selector_refused(expression))
    # Positive control: a label only people set selects as before.
    by_room = replace(HEATER_RULE, selector=Selector({"room": "nursery"}))
    assert selector_refused(by_room) is None and evaluate(compile_rule(by_room), {}, {}).holds
    assert not applies(by_room, "nursery-heater", {"room": "garage"}, "target_temp", 30)


class StatusKube:
    api = None

    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []

    async def apply_status(self, plural: str, namespace: str, name: str, kind: str, status: dict[str, Any],
                           reason: str) -> dict[str, Any]:
        self.written.append(status)
        return {**interlock({"matchLabels": {LOCATION_LABEL: "nursery"}}), "status": status}


def test_a_stored_interlock_on_the_location_is_read_guards_every_device_and_says_so_in_its_status() -> None:
    cache = DeviceCache()
    for name in ("nursery-heater", "hall-ac"):
        cache.upsert(device_body(name, labels={LOCATION_LABEL: "garage"} if name == "nursery-heater" else {}))
    kube = StatusKube()
    component = Interlocks(cast(Kube, kube), cache, ("home",))
    component.on_event("ADDED", interlock({"matchLabels": {LOCATION_LABEL: "nursery"}}))
    assert component.refused == {}, "read, not refused: refused would guard nothing"
    heater = cache.get(("home", "nursery-heater"))
    assert heater is not None
    (verdict,) = component.verdicts("home", heater, "target_temp", 30, lambda namespace, name: None)
    assert not verdict.holds and "corral.dev/location" in verdict.message
    asyncio.run(component.reconcile(("home", "nursery-heat")))
    conditions = {c["type"]: c for c in kube.written[-1]["conditions"]}
    assert conditions[SELECTOR_ACCEPTED]["status"] == "False" and conditions[SELECTOR_ACCEPTED]["reason"] == "DerivedLabel"
    assert "corral.dev/location" in conditions[SELECTOR_ACCEPTED]["message"]
    assert conditions["Compiled"]["status"] == "True"


def test_a_grant_on_a_derived_label_covers_nothing_and_says_why() -> None:
    view = GrantView(name="warm-kitchen", grantor="alice", grantor_may_approve=True, requester=AGENT,
                     actuators=frozenset({"target_temp"}), uses=3, used=0, expires_at=NOW + timedelta(hours=1),
                     devices=frozenset({"kitchen-heater"}), selector=Selector({LOCATION_LABEL: "kitchen"}),
                     values=(22,))
    for device in ("kitchen-heater", "nursery-heater"):  # named or renamed "Kitchen" by the agent: neither
        why = why_not_covered(view, AGENT, device, {LOCATION_LABEL: "kitchen"}, "target_temp", 22, "medium", NOW)
        assert why is not None and why.startswith("it covers nothing: its selector key corral.dev/location"), why
    by_room = replace(view, selector=Selector({"room": "kitchen"}))
    assert why_not_covered(by_room, AGENT, "kitchen-heater", {}, "target_temp", 22, "medium", NOW) is None

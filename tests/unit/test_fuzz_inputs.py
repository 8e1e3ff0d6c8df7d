"""Fuzzing every input the outside world controls, at the pure layer where it is first judged.

Devices send MQTT payloads; agents send MCP tool arguments and overlay text; anyone with access sends
Intent and Approval specs. For each, hostile input (random JSON of any shape, deep nesting, huge and
control-character strings, NaN and Infinity, wrong types) must end in the one refusal type that carries
a reason (BadMessage, ArgumentError, ValidationError) or in a value that is valid by construction —
never another exception, and never a value a contract does not allow. The default run tries a few
hundred cases per target; `--slow` runs a campaign of 20,000 each (see tests/conftest.py).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from corral.api.approval import ApprovalSpec
from corral.api.intent import OVERLAY_ACTIONS, OVERLAY_LIMITS, IntentSpec
from corral.contract.values import InvalidValue, check
from corral.decide.decision import DeviceFacts, IntentFacts, decide
from corral.devices import messages
from corral.gateway.tools.arguments import ArgumentError
from corral.gateway.tools.control import intent_spec
from tests.unit.test_gateway_exposure import CONTRACT, seen

HOSTILE_TEXT = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x9F), max_size=40),  # control characters
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "\u202e", "../..", "x" * 5000, "\x00" * 64]),
)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), HOSTILE_TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.dictionaries(st.one_of(HOSTILE_TEXT, st.sampled_from(
        ["id", "ok", "error", "state", "ts", "samples", "metric", "value", "event", "actuators", "sensors", "device_id",
         "name", "model", "fw", "type", "action", "risk", "level", "values", "range", "min", "max"])), inner, max_size=6)),
    max_leaves=40)
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _payload(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


RAW = st.one_of(JSON.map(_payload), st.integers(1, 5000).map(_nested), st.binary(max_size=256),
                st.just(b'{"id": "x", "ok": true, "state": {"a": NaN}}'), st.just(b"{" + b'"k":' * 10 + b"1"))


@given(RAW, st.sampled_from(["info", "status", "ack", "telemetry", "event"]))
def test_device_payloads_are_parsed_or_refused_with_a_reason(payload: bytes, kind: str) -> None:
    parse = {"info": lambda p: messages.parse_info(p, "fuzzed-device"), "status": messages.parse_status,
             "ack": messages.parse_ack, "telemetry": messages.parse_telemetry, "event": messages.parse_event}[kind]
    try:
        parse(payload)
    except messages.BadMessage as err:
        assert str(err), "a refusal says why"


@given(st.dictionaries(st.sampled_from(["device_id", "actuator", "action", "params", "reason", "request_id",
                                        "based_on", "requester"]), JSON, max_size=8),
       st.sampled_from([a.id for a in CONTRACT.actuators] + ["siren"]),
       st.one_of(JSON, st.fixed_dictionaries({"value": JSON})))
def test_control_arguments_either_fit_the_contract_or_are_refused(
        arguments: dict[str, Any], actuator: str, params: Any) -> None:
    arguments = {"device_id": "home/kitchen", "actuator": actuator, "action": arguments.get("action"),
                 "reason": "fuzz", **arguments, "params": params}
    if isinstance(arguments.get("action"), str) is False and CONTRACT.actuator(actuator):
        arguments["action"] = CONTRACT.actuator(actuator).action
    device = seen("kitchen", {"read", "write", "config"})
    try:
        _, spec = intent_spec(device, arguments, "agent", lambda _: None)
    except ArgumentError as err:
        assert str(err)
        return
    # What passes is exactly what the contract allows: nothing else can reach a device.
    target = CONTRACT.actuator(spec["actuator"])
    assert target is not None and spec["action"] == target.action
    try:
        assert check(target, spec["params"]["value"]) == spec["params"]["value"]
    except InvalidValue as err:  # pragma: no cover - would be the bug this test exists for
        raise AssertionError(f"the gateway let through {spec}: {err}") from None
    assert spec["requester"] == "agent", "the requester is always the caller"
    IntentSpec.model_validate(spec)


@given(st.sampled_from(sorted(OVERLAY_ACTIONS)), HOSTILE_TEXT)
def test_overlay_text_is_stored_clean_and_capped(action: str, text: str) -> None:
    field = OVERLAY_ACTIONS[action]
    facts = IntentFacts(uid="u", name="n", device="d", actuator=field, action=action, value=text, requester="agent",
                        created_at=datetime.now(UTC))
    decision = decide(facts, DeviceFacts(False, None, None, None), True, [], "0" * 64, datetime.now(UTC))
    assert decision.outcome == "execute" and isinstance(decision.value, str)
    assert not CONTROL.search(decision.value) and len(decision.value) <= OVERLAY_LIMITS[field]


@given(st.dictionaries(st.sampled_from(["device", "actuator", "action", "params", "reason", "requester", "basedOn",
                                        "intent", "paramsHash", "decision", "approver", "expiresAt", "extra"]),
                       JSON, max_size=10))
def test_intent_and_approval_specs_validate_or_are_refused_with_reasons(spec: dict[str, Any]) -> None:
    for model in (IntentSpec, ApprovalSpec):
        try:
            model.model_validate(spec)
        except ValidationError as err:
            assert err.errors()

"""Parsing untrusted device payloads: refused with a reason, never crashing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.devices import messages
from corral.devices.topics import Topics

INFO = {
    "device_id": "fan-1", "name": "Fan", "model": "corral-fan", "fw": "1.0.0",
    "actuators": [{"id": "fan", "name": "Fan", "type": "enum", "values": ["off", "on"], "action": "set_level",
                   "risk": "low", "level": "write"}],
}


def test_info_parses_into_a_contract_for_its_own_topic_only() -> None:
    assert messages.parse_info(json.dumps(INFO).encode(), "fan-1").model == "corral-fan"
    with pytest.raises(messages.BadMessage, match="names device_id 'fan-1' but was published for 'fan-2'"):
        messages.parse_info(json.dumps(INFO).encode(), "fan-2")


def test_info_with_an_unknown_action_kind_is_refused_naming_it() -> None:
    bad = {**INFO, "actuators": [{**INFO["actuators"][0], "action": "unlock_all"}]}
    with pytest.raises(messages.BadMessage, match=r"contract refused: actuators\.0\.action"):
        messages.parse_info(json.dumps(bad).encode(), "fan-1")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\xff\xfe", "not UTF-8"),
        (b"{not json", "not valid JSON"),
        (b'{"ts": NaN, "samples": []}', "not valid JSON (NaN is not allowed"),
        (b'{"ts": 1, "samples": [{"metric": "t", "value": 1e999, "ts": 1}]}', "numbers must be finite"),
        (b"[" * 50 + b"]" * 50, "nests deeper than 16"),
        (b"x" * (messages.MAX_PAYLOAD_BYTES + 1), "exceeds the 65536-byte limit"),
        (b'{"ts": -5, "samples": []}', "greater than or equal to 0"),
    ],
)
def test_bad_telemetry_is_refused_with_a_reason(payload: bytes, message: str) -> None:
    with pytest.raises(messages.BadMessage, match=message.replace("(", r"\(")):
        messages.parse_telemetry(payload)


def test_ack_and_status_parse() -> None:
    ack = messages.parse_ack(b'{"id": "c-1", "ok": true, "error": null, "state": {"fan": "on"}, "extra": 1}')
    assert ack.state == {"fan": "on"}
    assert messages.parse_status(b"offline") is False
    with pytest.raises(messages.BadMessage, match="'online' or 'offline'"):
        messages.parse_status(b"maybe")


@settings(max_examples=300)
@given(st.binary(max_size=512))
def test_random_bytes_never_escape_as_anything_but_bad_message(payload: bytes) -> None:
    for parse in (messages.parse_ack, messages.parse_telemetry, messages.parse_event):
        try:
            parse(payload)
        except messages.BadMessage:
            pass
    try:
        messages.parse_info(payload, "fan-1")
    except messages.BadMessage:
        pass


def test_topics_parse_only_our_own_well_formed_topics() -> None:
    topics = Topics("home/iot")
    assert topics.parse("home/iot/fan-1/ack") == ("fan-1", "ack")
    assert topics.parse("home/iot/Fan_1/ack") is None
    assert topics.parse("home/iot/fan-1/other") is None
    assert topics.parse("iot/fan-1/ack") is None
    assert topics.subscriptions()[0] == "home/iot/+/info"

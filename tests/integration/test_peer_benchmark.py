"""bench/peer_homeassistant.py's set-up path, without installing Home Assistant: its accounts on the real broker
log in and the played light answers a command sent as Home Assistant would, and what it types into Home
Assistant's MQTT form fits the form. The benchmark broke silently once (the broker began to require accounts,
and the form refused what the benchmark sent with "extra keys not allowed @ data['broker']")."""

from __future__ import annotations

import importlib
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from corral.devcluster.plane import Plane
from corral.privatefile import read_secret
from tests.harness import wait_for

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench"

# The broker step of Home Assistant 2025.4.4's MQTT config flow as its REST API shows it (POST
# /api/config/config_entries/flow {"handler": "mqtt"}), recorded by the benchmark (its result's ha_broker_form).
BROKER_FORM = {
    "type": "form", "flow_id": "f", "handler": "mqtt", "step_id": "broker", "errors": {},
    "data_schema": [{"selector": {"text": {"type": "text", "multiple": False, "multiline": False}}, "name": "broker", "required": True, "default": None},
                    {"selector": {"number": {"mode": "box", "min": 1.0, "max": 65535.0, "step": 1.0}}, "type": "integer", "name": "port", "required": True, "default": 1883},
                    {"selector": {"text": {"type": "text", "multiple": False, "multiline": False}}, "name": "username", "description": {"suggested_value": None}, "optional": True},
                    {"selector": {"text": {"type": "password", "multiple": False, "multiline": False}}, "name": "password", "description": {"suggested_value": None}, "optional": True}],
}


@pytest.fixture(scope="module")
def peer() -> ModuleType:
    sys.path.insert(0, str(BENCH))  # the benchmarks import each other as scripts do
    try:
        return importlib.import_module("peer_homeassistant")
    finally:
        sys.path.remove(str(BENCH))


def _client(plane: Plane, username: str, password: str | None) -> tuple[mqtt.Client, list[Any]]:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=username)
    if password is not None:
        client.username_pw_set(username, password)
    connected: list[Any] = []
    client.on_connect = lambda c, u, f, reason, p: connected.append(reason)
    client.connect("127.0.0.1", plane.mqtt_port)
    client.loop_start()
    return client, connected


def test_home_assistants_account_commands_the_played_light_and_an_anonymous_client_is_refused(
        peer: ModuleType, plane: Plane, tmp_path: Path) -> None:
    accounts = peer.peer_accounts(plane, tmp_path)
    assert set(accounts) == {peer.HA_ACCOUNT, peer.LIGHT_ACCOUNT}
    assert all(path.stat().st_mode & 0o777 == 0o600 for path in accounts.values())
    with peer.light_responder(plane.mqtt_port, accounts[peer.LIGHT_ACCOUNT]):
        ha, connected = _client(plane, peer.HA_ACCOUNT, read_secret(accounts[peer.HA_ACCOUNT]))
        states: list[bytes] = []
        turned_on = threading.Event()

        def on_message(_c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
            states.append(message.payload)
            if message.payload == b"ON":
                turned_on.set()

        ha.on_message = on_message
        try:
            ha.subscribe("peer/bench-light/state", qos=1)
            ha.publish("peer/bench-light/set", "ON", qos=1).wait_for_publish(10)
            # The light echoed Home Assistant's command, through the broker, under both accounts.
            assert turned_on.wait(10), f"no ON came back; states seen: {states}, connect: {connected}"
            assert connected and not connected[0].is_failure
        finally:
            ha.loop_stop()
            ha.disconnect()
    # What the benchmark used to do: connect without an account. The broker refuses it, so the accounts above
    # are what made the light answer.
    anonymous, refused = _client(plane, "peer-anonymous", None)
    try:
        wait_for(lambda: refused, "the broker's answer to an anonymous client")
        assert refused[0].is_failure, refused
    finally:
        anonymous.loop_stop()
        anonymous.disconnect()


def test_what_the_benchmark_types_into_home_assistants_broker_form_fits_it(peer: ModuleType) -> None:
    answer = peer.mqtt_flow_input(1883, peer.HA_ACCOUNT, "secret")
    assert peer.fitting(BROKER_FORM, answer) == answer
    # A form that does not ask for the broker (a menu first, or a changed step) stops the benchmark, naming the
    # step and what it asked for, instead of posting and reading "extra keys not allowed".
    menu = {"type": "menu", "step_id": "user", "menu_options": ["addon", "broker"]}
    with pytest.raises(SystemExit, match=r"step 'user' \(menu\) asking for \[\].*not asked: \['broker'"):
        peer.fitting(menu, answer)
    with pytest.raises(SystemExit, match=r"missing: \['broker'\]"):  # its default is null: none
        peer.fitting(BROKER_FORM, {key: value for key, value in answer.items() if key != "broker"})
    shown_again = {**BROKER_FORM, "errors": {"base": "cannot_connect"}}
    with pytest.raises(SystemExit, match="cannot_connect"):
        peer.fitting(shown_again, answer)

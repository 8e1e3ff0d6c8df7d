"""`corral sim`: arguments, errors a person can act on, and broker URLs. (Runs against a broker: tests/integration/test_sim_cli.py.)"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from corral.cli.main import cli
from corral_sim.fleet import Broker, FleetError, device_specs


def run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, ["sim", *args], env={"CORRAL_MQTT_URL": "", **(env or {})})


def test_help() -> None:
    result = run("--help")
    assert result.exit_code == 0
    assert "--preset" in result.output and "--device TYPE[:N]" in result.output and "--seed" in result.output


def test_an_unknown_device_type_lists_the_available_ones_on_stderr() -> None:
    result = run("--device", "nonsuch", "--mqtt", "mqtt://127.0.0.1:1")
    assert result.exit_code == 2
    assert "unknown device type 'nonsuch'; available: blind, door_contact, env_fan" in result.stderr
    assert result.stdout == ""


def test_nothing_to_simulate_and_no_broker_are_explained() -> None:
    result = run("--mqtt", "mqtt://127.0.0.1:1")
    assert result.exit_code == 2 and "nothing to simulate: pass --preset home or --device TYPE" in result.stderr
    result = run("--device", "relay")
    assert result.exit_code == 2 and "no broker: pass --mqtt URL or set CORRAL_MQTT_URL" in result.stderr


def test_an_unreachable_broker_is_reported_before_anything_starts() -> None:
    result = run("--device", "relay", env={"CORRAL_MQTT_URL": "mqtt://127.0.0.1:1"})
    assert result.exit_code == 1
    assert "cannot reach the MQTT broker at mqtt://127.0.0.1:1" in result.stderr


@pytest.mark.parametrize("bad", ["relay:x", "relay:0"])
def test_bad_counts_are_refused(bad: str) -> None:
    result = run("--device", bad, "--mqtt", "mqtt://127.0.0.1:1")
    assert result.exit_code == 2 and "count" in result.stderr


def test_unsupported_broker_urls_are_refused() -> None:
    result = run("--device", "relay", "--mqtt", "ws://broker:8080")
    assert result.exit_code == 1 and "unsupported broker URL" in result.stderr


def test_list_shows_every_type_with_its_actions() -> None:
    result = run("--list")
    assert result.exit_code == 0
    assert "thermostat" in result.stdout and "target_temp (set_value, low)" in result.stdout
    assert "locked (set_state, high)" in result.stdout


def test_broker_urls() -> None:
    assert Broker.from_url("mqtt://127.0.0.1:1884") == Broker("127.0.0.1", 1884)
    assert Broker.from_url("tcp://broker") == Broker("broker", 1883)
    assert Broker.from_url("localhost:1885") == Broker("localhost", 1885)
    assert Broker.from_url("mqtt://dev:s%40cret@h:1") == Broker("h", 1, "dev", "s@cret")
    assert Broker.from_url("mqtts://h") == Broker("h", 8883, tls=True)
    assert Broker.from_url("mqtts://h:1", {"a": "pw"}).account("a") == ("a", "pw")
    with pytest.raises(FleetError, match="no credential for device b: enroll it"):
        Broker.from_url("mqtt://h", {"a": "pw"}).account("b")
    for bad in ("ws://h:80", "mqtt://h:notaport", "mqtt://:1883"):
        with pytest.raises(FleetError):
            Broker.from_url(bad)


def test_device_ids_per_type_and_count() -> None:
    specs = device_specs({"env-fan": 2, "relay": 1})
    assert [(s.device_type, s.device_id) for s in specs] == [("env_fan", "env-fan-1"), ("env_fan", "env-fan-2"), ("relay", "relay-1")]


@pytest.mark.parametrize("prefix", ["a/+/b", "#", "/iot", "iot/", ""])
def test_bad_topic_prefixes_are_refused(prefix: str) -> None:
    result = run("--device", "relay", "--mqtt", "mqtt://127.0.0.1:1", "--prefix", prefix)
    assert result.exit_code == 1 and "bad topic prefix" in result.stderr

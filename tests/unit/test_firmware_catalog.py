"""The device catalog: every contract file is a valid contract, frozen into firmware modules that are up to date."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from corral.contract.model import DEVICE_ID_PATTERN, Contract
from corral_sim import catalog
from corral_sim.presets import HOME, preset

FILES = catalog.catalog_files()


def contract(device_type: str) -> Contract:
    return Contract.model_validate({**catalog.contract_for(device_type), "device_id": "example-1"})


@pytest.mark.parametrize("device_type", sorted(FILES))
def test_every_catalog_file_is_a_valid_contract_without_a_device_id(device_type: str) -> None:
    data = json.loads(FILES[device_type].read_text(encoding="utf-8"))
    assert "device_id" not in data
    Contract.model_validate({**data, "device_id": "example-1"})


def test_the_generated_modules_are_up_to_date() -> None:
    assert catalog.stale_files() == [], "run: python -m corral_sim.catalog"
    assert catalog.main(["--check"]) == 0


def test_the_frozen_contracts_are_the_catalog_files() -> None:
    assert catalog.device_types() == tuple(sorted(FILES))
    for device_type, path in FILES.items():
        assert catalog.contract_for(device_type) == json.loads(path.read_text(encoding="utf-8"))


def test_a_stale_module_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    devices = tmp_path / "devices"
    devices.mkdir()
    (devices / "relay.json").write_text(FILES["relay"].read_text(encoding="utf-8"))
    monkeypatch.setattr(catalog, "DEVICES_DIR", devices)
    monkeypatch.setattr(catalog, "CONTRACTS_DIR", tmp_path / "contracts")
    assert len(catalog.stale_files()) == 2  # __init__.py and relay.py are missing
    catalog.generate()
    assert catalog.stale_files() == []
    (devices / "relay.json").write_text(FILES["relay"].read_text(encoding="utf-8").replace('"medium"', '"low"'))
    assert catalog.stale_files() == [tmp_path / "contracts" / "relay.py"]


def test_an_invalid_contract_file_is_refused_with_its_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "toggler.json").write_text(json.dumps({
        "name": "Toggler", "model": "t", "fw": "1.0.0",
        "actuators": [{"id": "x", "name": "X", "type": "bool", "action": "toggle", "risk": "low", "level": "write"}],
    }))
    monkeypatch.setattr(catalog, "DEVICES_DIR", tmp_path)
    with pytest.raises(catalog.CatalogError, match=r"toggler.json: not a valid contract"):
        catalog.expected_files()


def test_the_catalog_has_the_devices_the_issue_names() -> None:
    fan = contract("env_fan")
    assert {s.metric for s in fan.sensors} >= {"temperature", "humidity"}
    assert fan.actuator("fan").values == ["off", "low", "mid", "high"]
    assert contract("relay").actuator("relay").type == "bool"
    door = contract("door_contact")
    assert door.events[0].values == ["open", "closed"] and "inverted" in door.events[0].description.lower()
    light = contract("light")
    assert (light.actuator("brightness").range.min, light.actuator("brightness").range.max) == (0, 100)
    assert light.actuator("color_temp").unit == "K" and contract("rgb_light").actuator("color").type == "color"
    ac = contract("thermostat")
    target = ac.actuator("target_temp")
    assert (target.range.min, target.range.max, target.step) == (16, 30, 0.5)
    assert ac.actuator("mode").type == "enum" and ac.actuator("fan_speed").action == "set_level"
    blind = contract("blind").actuator("position")
    assert blind.action == "set_position" and (blind.range.min, blind.range.max) == (0, 100)
    assert contract("lock").actuator("locked").risk == "high"
    assert contract("water_valve").actuator("open").type == "bool"
    assert "ring buffer" in contract("scale").sensors[0].description
    assert contract("sht30").actuator("heater").type == "bool"
    portions = contract("pet_feeder").actuator("portions")
    assert portions.type == "counter" and portions.action == "feed"


def test_the_relay_and_the_space_heater_declare_on_time_limits() -> None:
    relay = contract("relay").actuator("relay")
    # A relay switches an unknown load: bounded to 4 h on, but a hold is not required (issue 32's lead decision).
    assert relay.max_on_seconds == 4 * 3600 and relay.hold_required is None and relay.off_value() is False
    heater = contract("space_heater")
    power = heater.actuator("power")
    assert power.type == "enum" and power.values == ["off", "low", "high"] and power.action == "set_level"
    assert (power.risk, power.level, power.hold_required, power.max_on_seconds) == ("high", "write", True, 2 * 3600)
    assert power.off_value() == "off" and power.failsafe is not None and power.failsafe.value == "off"
    assert {s.metric for s in heater.sensors} >= {"temperature", "load"}
    assert all(s.interval_s for s in heater.sensors)
    # Leak rule parts: the valve closes with false, the probe reads wet or dry.
    assert contract("water_valve").actuator("open").off_value() is False
    assert any(s.metric == "wet" for s in contract("leak_probe").sensors)


def test_every_actuator_declares_risk_and_level_and_every_device_has_a_config_level_updater() -> None:
    for device_type in FILES:
        data = catalog.contract_for(device_type)
        assert all("risk" in a and "level" in a for a in data["actuators"]), device_type
        updater = contract(device_type).actuator("firmware")
        assert updater is not None and updater.action == "set_version" and updater.level == "config", device_type
        assert data["fw"] in updater.values


def test_the_home_preset_is_a_household_of_about_40_valid_devices() -> None:
    specs = preset("home")
    assert 38 <= len(specs) <= 45
    ids = [s.device_id for s in specs]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(DEVICE_ID_PATTERN, i) for i in ids)
    assert {s.device_type for s in specs} == set(FILES), "every catalog type appears"
    assert len({room for room, _, _ in HOME}) >= 6
    with pytest.raises(KeyError, match="available: home"):
        preset("castle")

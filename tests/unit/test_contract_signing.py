"""Signing contracts as a vendor does (`corral contracts keygen`, `corral contracts sign`), what the firmware then
announces, and the controller's check of it. (The demo and the chart with signatures required:
tests/integration/test_demo.py, test_chart.py.)"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.cli.main import cli
from corral.client.signing import SigningError, firmware_contracts
from corral.contract.canonical import device_bound_bytes
from corral.contract.model import Contract
from corral.contract.signature import load_public_key, sign, signed_contract, verify
from corral.devices.messages import parse_info
from corral_fw.clock import ManualClock
from corral_fw.device import Device
from corral_fw.simboard import SimBoard
from corral_sim.catalog import contract_for, device_types


def announced(contract: dict[str, Any], device_id: str) -> Contract:
    """What the controller makes of the `info` the catalog's firmware publishes with this contract."""
    clock = ManualClock()
    firmware = Device(contract, device_id, SimBoard(contract, device_id, 1, "lock", 0, clock=clock), clock)
    return parse_info(firmware.info_payload.encode(), device_id)


@pytest.fixture
def vendor(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A key made with `corral contracts keygen`, and the public key it printed, as the controller trusts it."""
    key = tmp_path / "vendor.pem"
    made = CliRunner().invoke(cli, ["contracts", "keygen", "--key", str(key), "--public", str(tmp_path / "vendor.pub")])
    assert made.exit_code == 0, made.output
    assert made.stdout.startswith("-----BEGIN PUBLIC KEY-----") and "PRIVATE" not in made.stdout
    assert (tmp_path / "vendor.pub").read_text() == made.stdout
    return key, {"vendor": load_public_key("vendor", made.stdout)}


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_replaces_one(
        vendor: tuple[Path, dict[str, Any]]) -> None:
    key, _trusted = vendor
    assert key.stat().st_mode & 0o777 == 0o600 and b"PRIVATE KEY" in key.read_bytes()
    before = key.read_bytes()
    again = CliRunner().invoke(cli, ["contracts", "keygen", "--key", str(key)])
    assert again.exit_code == 1 and "exists: a new key there would orphan every contract signed" in again.stderr
    assert key.read_bytes() == before
    bad = CliRunner().invoke(cli, ["contracts", "keygen", "--key", str(key.with_name("k2.pem")), "--secret", "keys"])
    assert bad.exit_code == 2 and "'keys' is not NAMESPACE/NAME" in bad.stderr


def test_the_signed_catalog_is_accepted_from_every_device_of_each_type_and_a_stranger_key_is_not(
        vendor: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    key, trusted = vendor
    done = CliRunner().invoke(cli, ["contracts", "sign", "--key", str(key), "--out", str(tmp_path / "signed.json")])
    assert done.exit_code == 0, done.output
    build = json.loads((tmp_path / "signed.json").read_text())
    assert sorted(build) == sorted(device_types())
    assert firmware_contracts(tmp_path / "signed.json") == build  # what `corral sim --signed-contracts` runs
    # One signature per device type, made at build time, holds for any device id the instance gets.
    for device_id in ("front-door-lock", "garage-lock"):
        check = verify(announced(build["lock"], device_id), trusted)
        assert (check.outcome, check.detail) == ("valid", "signed by trusted key 'vendor' for its device type")
    # Positive control above; the unsigned catalog and a stranger's signature are refused.
    assert verify(announced(contract_for("lock"), "front-door-lock"), trusted).outcome == "unsigned"
    stranger = signed_contract(contract_for("lock"), Ed25519PrivateKey.generate())
    assert verify(announced(stranger, "front-door-lock"), trusted).outcome == "invalid"
    # A signed contract changed after signing (an actuator's risk lowered) is refused.
    lowered = json.loads(json.dumps(build["lock"]))
    lowered["actuators"][0]["risk"] = "low"
    assert verify(announced(lowered, "front-door-lock"), trusted).outcome == "invalid"


def test_a_signature_made_for_one_device_still_verifies_for_that_device_only() -> None:
    """The protocol's first form covered the device id too; contracts signed that way keep working."""
    key = Ed25519PrivateKey.generate()
    trusted = {"factory": key.public_key()}
    contract = Contract.model_validate({**contract_for("relay"), "device_id": "plug-1"})
    bound = base64.b64encode(key.sign(device_bound_bytes(contract))).decode()
    assert verify(contract.model_copy(update={"signature": bound}), trusted).detail.endswith("for this device")
    other = Contract.model_validate({**contract_for("relay"), "device_id": "plug-2", "signature": bound})
    assert verify(other, trusted).outcome == "invalid"
    assert verify(other.model_copy(update={"signature": sign(other, key)}), trusted).outcome == "valid"


def test_sign_takes_types_and_files_and_says_what_is_wrong(vendor: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    key, trusted = vendor
    acme = tmp_path / "acme_light.json"
    acme.write_text(json.dumps({**contract_for("light"), "model": "acme-light", "version": 7}))
    done = CliRunner().invoke(cli, ["contracts", "sign", "lock", str(acme), "--key", str(key)])
    assert done.exit_code == 0, done.output
    build = json.loads(done.stdout)
    assert sorted(build) == ["acme_light", "lock"] and build["acme_light"]["version"] == 7
    assert verify(announced(build["acme_light"], "porch-light"), trusted).outcome == "valid"
    unversioned = tmp_path / "old.json"
    unversioned.write_text(json.dumps({k: v for k, v in contract_for("relay").items() if k != "version"}))
    refused = CliRunner().invoke(cli, ["contracts", "sign", str(unversioned), "--key", str(key)])
    assert refused.exit_code == 1
    assert 'old.json: the contract has no "version": a signed contract must carry one' in refused.stderr
    unknown = CliRunner().invoke(cli, ["contracts", "sign", "toaster", "--key", str(key)])
    assert unknown.exit_code == 1 and "unknown device type 'toaster'; available: blind" in unknown.stderr
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**contract_for("relay"), "actuators": [{"id": "x"}]}))
    invalid = CliRunner().invoke(cli, ["contracts", "sign", str(broken), "--key", str(key)])
    assert invalid.exit_code == 1 and "broken.json: not a valid contract" in invalid.stderr
    os.chmod(key, 0o644)
    exposed = CliRunner().invoke(cli, ["contracts", "sign", "lock", "--key", str(key)])
    assert exposed.exit_code == 1 and "has mode 0644: others could read it" in exposed.stderr


def test_the_simulator_takes_a_signed_build_of_its_own_catalog_only(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    build = {"lock": signed_contract(contract_for("lock"), key), "relay": signed_contract(contract_for("relay"), key)}
    path = tmp_path / "signed.json"
    path.write_text(json.dumps(build))
    assert firmware_contracts(path) == build
    edited = {**build, "lock": {**build["lock"], "fw": "9.9.9"}}
    path.write_text(json.dumps(edited))
    with pytest.raises(SigningError, match="the signed contract of lock is not the catalog's \\(differs in fw\\)"):
        firmware_contracts(path)
    path.write_text(json.dumps({"relay": contract_for("relay")}))
    with pytest.raises(SigningError, match="the contract of relay carries no signature"):
        firmware_contracts(path)
    sim = CliRunner().invoke(cli, ["sim", "--device", "relay", "--mqtt", "mqtt://127.0.0.1:1",
                                   "--signed-contracts", str(path)], env={"CORRAL_MQTT_URL": ""})
    assert sim.exit_code == 1 and "carries no signature" in sim.stderr

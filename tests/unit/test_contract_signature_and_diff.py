"""Contract signatures and contract diffs."""

from __future__ import annotations

import base64

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.contract.diff import contract_diff
from corral.contract.model import Contract
from corral.contract.signature import load_public_key, sign, verify

BASE = {
    "device_id": "lock-1", "name": "Lock", "model": "corral-lock", "fw": "1.0.0",
    "actuators": [{"id": "bolt", "name": "Bolt", "type": "enum", "values": ["locked", "unlocked"],
                   "action": "set_mode", "risk": "high", "level": "write"}],
}


def test_signed_contract_verifies_and_tampering_or_unknown_keys_do_not() -> None:
    key = Ed25519PrivateKey.generate()
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    trusted = {"factory": load_public_key("factory", public_pem)}
    contract = Contract.model_validate(BASE)
    signed = contract.model_copy(update={"signature": sign(contract, key)})
    assert verify(signed, trusted).outcome == "valid"
    assert verify(contract, trusted).outcome == "unsigned"
    tampered = Contract.model_validate({**signed.model_dump(), "fw": "6.6.6"})
    assert verify(tampered, trusted).outcome == "invalid"
    stranger = Ed25519PrivateKey.generate()
    assert "matches no trusted key (trusted: factory)" in verify(
        contract.model_copy(update={"signature": sign(contract, stranger)}), trusted
    ).detail


def test_raw_base64_keys_load_and_garbage_keys_are_named() -> None:
    raw = Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    load_public_key("raw", base64.b64encode(raw))
    try:
        load_public_key("broken", "not a key")
    except ValueError as err:
        assert "signing key 'broken'" in str(err)
    else:
        raise AssertionError("garbage key accepted")


def test_diff_names_what_changed() -> None:
    old = Contract.model_validate(BASE)
    new = Contract.model_validate(
        {**BASE, "fw": "1.1.0", "actuators": [{**BASE["actuators"][0], "values": ["locked", "unlocked", "latched"]},
                                              {"id": "light", "name": "Light", "type": "bool", "action": "set_state",
                                               "risk": "low", "level": "write"}]}
    )
    assert contract_diff(old, new) == [
        "fw: 1.0.0 -> 1.1.0",
        "actuator light added: id=light, type=bool, action=set_state, risk=low, level=write",
        "actuator bolt: values [locked, unlocked] -> [locked, unlocked, latched]",
    ]

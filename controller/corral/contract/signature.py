"""Contract signatures: Ed25519 over the canonical contract, checked against trusted public keys.

Where signing is required, a contract that is unsigned, signed by an unknown
key or altered after signing is refused, so a compromised device cannot claim
new abilities. Keys are given as PEM (SubjectPublicKeyInfo) or as the raw
32-byte key in base64; each has a name so refusals and Events can say which.

A signature covers a device type's contract as its firmware is built (canonical.signed_bytes: no device
id), so a build step signs once per release and every device of the type carries the same signature. A
signature made for one device (its id included, the protocol's first form) is accepted too.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from corral.contract.canonical import device_bound_bytes, signed_bytes
from corral.contract.model import Contract

# The device id a contract of the catalog (which has none: every instance gets its own) is checked with.
PLACEHOLDER_DEVICE_ID = "example-1"


@dataclass(frozen=True)
class SignatureCheck:
    outcome: Literal["valid", "unsigned", "invalid"]
    detail: str


def load_public_key(name: str, text: str | bytes) -> Ed25519PublicKey:
    """Parse one trusted key; raise ValueError naming the key and the accepted forms."""
    data = text.encode() if isinstance(text, str) else text
    try:
        if b"BEGIN PUBLIC KEY" in data:
            key = serialization.load_pem_public_key(data)
        else:
            key = Ed25519PublicKey.from_public_bytes(base64.b64decode(data.strip(), validate=True))
    except (ValueError, binascii.Error, TypeError) as err:
        raise ValueError(
            f"signing key {name!r} is neither a PEM public key nor a base64 32-byte Ed25519 key: {err}"
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"signing key {name!r} is not an Ed25519 key")
    return key


def verify(contract: Contract, keys: dict[str, Ed25519PublicKey]) -> SignatureCheck:
    if contract.signature is None:
        return SignatureCheck("unsigned", "the contract carries no signature")
    try:
        signature = base64.b64decode(contract.signature, validate=True)
    except (ValueError, binascii.Error):
        return SignatureCheck("invalid", "the signature is not base64")
    forms = ((signed_bytes(contract), "its device type"), (device_bound_bytes(contract), "this device"))
    for name, key in sorted(keys.items()):
        for message, scope in forms:
            try:
                key.verify(signature, message)
            except InvalidSignature:
                continue
            return SignatureCheck("valid", f"signed by trusted key {name!r} for {scope}")
    trusted = ", ".join(sorted(keys)) or "none configured"
    return SignatureCheck("invalid", f"the signature matches no trusted key (trusted: {trusted})")


def sign(contract: Contract, private_key: Ed25519PrivateKey) -> str:
    """The signature a build pipeline puts into the firmware's contract (used by tests and tools)."""
    return base64.b64encode(private_key.sign(signed_bytes(contract))).decode()


def signed_contract(data: dict[str, Any], private_key: Ed25519PrivateKey) -> dict[str, Any]:
    """`data` (a contract as the firmware embeds it, with or without a device id) with its signature: what a build
    step writes into the firmware. Raises ValueError saying what is wrong: not a valid contract, or no version
    (a signed contract must carry one, so that an older one can be refused as a replay)."""
    unsigned = {k: v for k, v in data.items() if k != "signature"}
    try:
        contract = Contract.model_validate({"device_id": PLACEHOLDER_DEVICE_ID, **unsigned})
    except ValueError as err:
        raise ValueError(f"not a valid contract: {err}") from None
    if contract.version is None:
        raise ValueError('the contract has no "version": a signed contract must carry one (a whole number from 1, '
                         "raised with every signed release), so that the controller can refuse an older one")
    return {**unsigned, "signature": sign(contract, private_key)}


def load_private_key(text: bytes) -> Ed25519PrivateKey:
    """A signing key from PEM (PKCS8, no password); raise ValueError saying what it is instead."""
    try:
        key = serialization.load_pem_private_key(text, password=None)
    except (ValueError, TypeError) as err:
        raise ValueError(f"not a PEM private key without a password ({err})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("not an Ed25519 key (contracts are signed with Ed25519)")
    return key


def private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def public_pem(key: Ed25519PrivateKey) -> bytes:
    """The public half, PEM: what a trusted-keys Secret holds (`--signing-keys`, chart `signing.keysSecret`)."""
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

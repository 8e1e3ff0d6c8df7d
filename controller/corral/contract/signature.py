"""Contract signatures: Ed25519 over the canonical contract, checked against trusted public keys.

Where signing is required, a contract that is unsigned, signed by an unknown
key or altered after signing is refused, so a compromised device cannot claim
new abilities. Keys are given as PEM (SubjectPublicKeyInfo) or as the raw
32-byte key in base64; each has a name so refusals and Events can say which.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from corral.contract.canonical import signed_bytes
from corral.contract.model import Contract


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
    message = signed_bytes(contract)
    for name, key in sorted(keys.items()):
        try:
            key.verify(signature, message)
        except InvalidSignature:
            continue
        return SignatureCheck("valid", f"signed by trusted key {name!r}")
    trusted = ", ".join(sorted(keys)) or "none configured"
    return SignatureCheck("invalid", f"the signature matches no trusted key (trusted: {trusted})")


def sign(contract: Contract, private_key: Ed25519PrivateKey) -> str:
    """The signature a build pipeline puts into the firmware's contract (used by tests and tools)."""
    return base64.b64encode(private_key.sign(signed_bytes(contract))).decode()

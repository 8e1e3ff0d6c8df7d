"""The audit signing key: an Ed25519 private key in a PEM file (in the chart, a Secret mounted as one).

On the local plane the file is made on first start; `corral audit verify` needs the public half, which
is written into the audit directory as NAME.pub.pem. Keep a copy of that one away from the log: a verifier that takes
the key from the same volume as the log trusts whoever could write the volume.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.privatefile import write_private


class AuditKeyError(ValueError):
    pass


def public_pem(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_private_key(path: Path, create: bool) -> Ed25519PrivateKey:
    """The key in `path`; made there (0600) first when `create` and the file does not exist."""
    if not path.exists():
        if not create:
            raise AuditKeyError(f"{path}: no audit signing key there (an Ed25519 private key, PEM)")
        key = Ed25519PrivateKey.generate()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
    try:
        loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as err:
        raise AuditKeyError(f"{path}: not a PEM private key without a password ({err})") from None
    if not isinstance(loaded, Ed25519PrivateKey):
        raise AuditKeyError(f"{path}: not an Ed25519 key (the audit log is signed with Ed25519)")
    return loaded

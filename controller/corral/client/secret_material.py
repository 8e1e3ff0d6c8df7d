"""What a Secret that a Corral component owns must hold, and the material that is missing from it.

Pure apart from the random keys and the clock: Secret data in (or nothing), the data to write out (or None when
what exists already is right). Kept apart from `own_secrets.py`, which reads and writes the API, so that the
rules (keep what exists, add what is missing, a new certificate from the same CA only when the names change or
it is about to expire) are tested without a cluster.

Two shapes, never mixed in one Secret:
- an Opaque Secret of generated values: Ed25519 private keys (PEM, PKCS8: the audit signing keys) and random
  passwords (the broker accounts). A key that is there is never replaced; a missing one is added.
- a kubernetes.io/tls Secret with a CA and a server certificate for a list of names (DNS names or IP
  addresses): ca.crt, ca.key, tls.crt, tls.key. The CA stays for good, so whoever trusts it keeps trusting.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.client.pki import KeyPair, issue, new_ca

TLS_TYPE = "kubernetes.io/tls"
OPAQUE_TYPE = "Opaque"
TLS_KEYS = ("ca.crt", "ca.key", "tls.crt", "tls.key")
# A server certificate this close to its end is made again at the next start (pods restart often enough).
RENEW_BEFORE = timedelta(days=30)
SERVER_CERT_DAYS = 825  # what browsers and most TLS stacks accept for a server certificate
PASSWORD_BYTES = 24  # 32 URL-safe characters: no quoting needed in a broker URL or a config file
_KEY_NAME = re.compile(r"^[-._a-zA-Z0-9]+$")  # what Kubernetes allows as a Secret data key


class MaterialError(ValueError):
    """A request that cannot be met, with what was wrong and what is allowed."""


@dataclass
class Wanted:
    """What one Secret must hold. `server_names` set: a kubernetes.io/tls Secret; else an Opaque one."""

    name: str
    ed25519: list[str] = field(default_factory=list)
    passwords: list[str] = field(default_factory=list)
    server_names: list[str] = field(default_factory=list)

    @property
    def secret_type(self) -> str:
        return TLS_TYPE if self.server_names else OPAQUE_TYPE

    def check(self) -> None:
        generated = [*self.ed25519, *self.passwords]
        if self.server_names and generated:
            raise MaterialError(f"Secret {self.name}: a server certificate's Secret (kubernetes.io/tls) holds only "
                                f"{', '.join(TLS_KEYS)}; put {', '.join(generated)} in a Secret of their own")
        for key in generated:
            if not _KEY_NAME.match(key) or len(key) > 253:
                raise MaterialError(f"Secret {self.name}: {key!r} is not a Secret data key (letters, digits, "
                                    "'-', '_' and '.', at most 253)")
        if len(set(generated)) != len(generated):
            raise MaterialError(f"Secret {self.name}: a data key is asked for twice ({', '.join(generated)})")
        for name in self.server_names:
            if not name or "," in name or " " in name:
                raise MaterialError(f"Secret {self.name}: {name!r} is not a DNS name or an IP address")
        if self.server_names and not _dns_names(self.server_names):
            raise MaterialError(f"Secret {self.name}: the certificate needs at least one DNS name (its common "
                                f"name), not only IP addresses ({', '.join(self.server_names)})")


def fill(wanted: Wanted, current: dict[str, bytes] | None, now: datetime | None = None) -> dict[str, bytes] | None:
    """The Secret's data with everything `wanted` asks for: None when `current` has it all already (nothing to
    write); else `current` with what is missing added (or the whole data when there is no Secret yet)."""
    wanted.check()
    if wanted.server_names:
        return _fill_tls(wanted, current, now or datetime.now(UTC))
    data = dict(current or {})
    for key in wanted.ed25519:
        if key not in data:
            data[key] = Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    for key in wanted.passwords:
        if not data.get(key):
            data[key] = secrets.token_urlsafe(PASSWORD_BYTES).encode()
    return None if current is not None and data == current else data


def _fill_tls(wanted: Wanted, current: dict[str, bytes] | None, now: datetime) -> dict[str, bytes] | None:
    data = dict(current or {})
    if not (data.get("ca.crt") and data.get("ca.key")):
        # A Secret with a certificate but without its CA's key was not made here: refuse rather than replace a
        # CA that devices or readers may already trust.
        if data.get("tls.crt"):
            raise MaterialError(f"Secret {wanted.name} holds a certificate but no ca.key: it was not made by Corral. "
                                "Delete it to have a new CA made, or name it as an existing Secret in the values")
        ca = new_ca(f"{wanted.name} CA")
        data["ca.crt"], data["ca.key"] = ca.cert_pem, ca.key_pem
    if data.get("tls.crt") and data.get("tls.key") and _still_good(data["tls.crt"], data["ca.crt"], wanted, now):
        return None if current is not None and data == current else data
    cert = issue(KeyPair(data["ca.key"], data["ca.crt"]), _dns_names(wanted.server_names)[0],
                 server_names=tuple(wanted.server_names), days=SERVER_CERT_DAYS)
    data["tls.crt"], data["tls.key"] = cert.cert_pem, cert.key_pem
    return data


def _still_good(cert_pem: bytes, ca_pem: bytes, wanted: Wanted, now: datetime) -> bool:
    """The certificate is from this CA, for exactly the names wanted, and not about to expire."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except (ValueError, TypeError, InvalidSignature):
        return False
    return cert.not_valid_after_utc - RENEW_BEFORE > now and certificate_names(cert_pem) == _normalized(wanted.server_names)


def certificate_names(cert_pem: bytes) -> set[str]:
    """The DNS names and IP addresses a certificate is for (its subject alternative names)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(names.get_values_for_type(x509.DNSName)) | {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}


def _normalized(names: list[str]) -> set[str]:
    """The names as a certificate gives them back: IP addresses in their canonical form (0:0::1 is ::1)."""
    out = set()
    for name in names:
        try:
            out.add(str(ipaddress.ip_address(name)))
        except ValueError:
            out.add(name)
    return out


def _dns_names(names: list[str]) -> list[str]:
    out = []
    for name in names:
        try:
            ipaddress.ip_address(name)
        except ValueError:
            out.append(name)
    return out

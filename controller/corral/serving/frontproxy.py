"""Callers through the Kubernetes aggregation layer: who the front proxy says they are.

kube-apiserver authenticates and authorizes a request for an APIService (readings.corral.dev), then proxies
it to this server over TLS with its front-proxy client certificate and names the caller in headers:
`X-Remote-User`, one `X-Remote-Group` per group (and `X-Remote-Extra-*`, not used here). Those headers
mean something only over that certificate: anyone can send them. So a request that names a caller is
believed only when its TLS client certificate

- was issued by a CA of the requestheader bundle (`--requestheader-client-ca-file` of kube-apiserver; the
  `requestheader-client-ca-file` key of the ConfigMap kube-system/extension-apiserver-authentication), and
- has a common name among the allowed names (`--requestheader-allowed-names`; an empty list allows any name
  the CA signed, as in Kubernetes);

otherwise it is refused (Unauthenticated: a forged header), whatever else it carries. A request that names
nobody is left to the bearer token (TokenReview), as a direct caller's is.

The TLS layer does the first check: `configure` makes the server ask for a client certificate (optional,
so direct callers without one still connect) and verify it against the bundle alone; a certificate from
another CA fails the handshake. `caller` checks again on the certificate itself (issued directly by a CA of
the bundle, in its validity period, for client authentication) and checks its name. A front-proxy
certificate issued through an intermediate CA is therefore not accepted; Kubernetes' own set-ups (kubeadm,
the local plane's tools/kube) sign it directly.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from aiohttp import web
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from multidict import CIMultiDictProxy

from corral.serving.auth import Caller, Unauthenticated

FRONT_PROXY_CLIENT = "front-proxy-client"
USERNAME_HEADERS = ("X-Remote-User",)
GROUP_HEADERS = ("X-Remote-Group",)


class FrontProxy:
    def __init__(self, ca: str | Path | bytes, allowed_names: Iterable[str] = (FRONT_PROXY_CLIENT,), *,
                 username_headers: Iterable[str] = USERNAME_HEADERS,
                 group_headers: Iterable[str] = GROUP_HEADERS) -> None:
        """`ca`: the requestheader CA bundle, a PEM file's path or its content (bytes)."""
        self.ca_pem = ca if isinstance(ca, bytes) else Path(ca).read_bytes()
        try:
            self.cas = tuple(x509.load_pem_x509_certificates(self.ca_pem))
        except ValueError as err:
            where = "the requestheader CA" if isinstance(ca, bytes) else str(ca)
            raise ValueError(f"{where} holds no PEM certificate: {err}") from None
        self.allowed_names = frozenset(allowed_names)
        self.username_headers = tuple(username_headers)
        self.group_headers = tuple(group_headers)
        if not self.username_headers:
            raise ValueError("a front proxy names its caller in a header: give at least one username header")

    def configure(self, context: ssl.SSLContext) -> None:
        """Make a server context ask for a client certificate (optional) and verify it against the bundle.

        The context should trust no other CA for client certificates (an `ssl.SSLContext(PROTOCOL_TLS_SERVER)`,
        not `create_default_context`, which loads the system's); `caller` refuses other issuers regardless."""
        context.load_verify_locations(cadata=self.ca_pem.decode())
        context.verify_mode = ssl.CERT_OPTIONAL

    def caller(self, peer_der: bytes | None, headers: CIMultiDictProxy[str]) -> Caller | None:
        """The caller the front proxy vouches for; None when the request names none (then its bearer token
        decides); Unauthenticated when it names one without the front proxy's certificate."""
        if not names_a_caller(headers, self.username_headers + self.group_headers):
            return None
        if peer_der is None:
            raise Unauthenticated(f"{self.username_headers[0]} without the front proxy's client certificate: only "
                                  "the Kubernetes aggregation layer may name the caller; send a bearer token instead")
        refusal = self._refusal(peer_der)
        if refusal is not None:
            raise Unauthenticated(f"{self.username_headers[0]} over a client certificate that is not the front "
                                  f"proxy's: {refusal}")
        username = next((v for v in _values(headers, self.username_headers)), "")
        if not username:
            raise Unauthenticated(f"the front proxy named no user ({', '.join(self.username_headers)})")
        return Caller(username, tuple(_values(headers, self.group_headers)))

    def _refusal(self, peer_der: bytes) -> str | None:
        """Why this certificate is not the front proxy's; None when it is."""
        try:
            cert = x509.load_der_x509_certificate(peer_der)
        except ValueError:
            return "it cannot be read"
        if not any(_issued_by(cert, ca) for ca in self.cas):
            return f"its issuer {cert.issuer.rfc4514_string()!r} is not a requestheader CA"
        now = datetime.now(UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            return "it is not valid at this time"
        try:
            usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        except x509.ExtensionNotFound:
            usages = None
        if usages is not None and ExtendedKeyUsageOID.CLIENT_AUTH not in usages \
                and ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE not in usages:
            return "it is not for client authentication"
        names = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
        common_name = names[0] if names else ""
        if self.allowed_names and common_name not in self.allowed_names:
            return f"its common name {common_name!r} is not one of {', '.join(sorted(self.allowed_names))}"
        return None


def names_a_caller(headers: CIMultiDictProxy[str], names: Iterable[str]) -> bool:
    """Whether the request carries any of these identity headers (empty or not)."""
    return any(name in headers for name in names)


def caller_of(front_proxy: FrontProxy | None, request: web.BaseRequest) -> Caller | None:
    """The caller the aggregation layer vouches for in this request, if any. Without a front proxy to trust,
    a request that names its caller in X-Remote-* headers is refused (Unauthenticated), never believed."""
    if front_proxy is None:
        if names_a_caller(request.headers, USERNAME_HEADERS + GROUP_HEADERS):
            raise Unauthenticated("this server trusts no front proxy (corral run --requestheader-client-ca-file or "
                                  "--requestheader-from-cluster): X-Remote-User is not accepted")
        return None
    return front_proxy.caller(peer_certificate(request), request.headers)


def peer_certificate(request: web.BaseRequest) -> bytes | None:
    """The TLS client certificate of the request's connection (DER), as the TLS layer verified it."""
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    if ssl_object is None:
        return None
    der: bytes | None = ssl_object.getpeercert(binary_form=True)
    return der


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _values(headers: CIMultiDictProxy[str], names: Iterable[str]) -> list[str]:
    """Every non-empty value of these headers, in order (one group per header line, as Kubernetes sends them)."""
    return [value for name in names for value in headers.getall(name, []) if value]

"""The aggregation layer's front proxy: X-Remote-* headers are believed only over its client certificate.

First `FrontProxy.caller` alone (certificates made here with `cryptography`), then the real ReadServer over
TLS with a stand-in for the API server's reviews: a forged header, a certificate of another CA or name, the
front proxy's own certificate, a direct caller with a bearer token, and discovery without credentials. Then
where `corral run` gets the front proxy from (a file, or the cluster's extension-apiserver-authentication
ConfigMap), and the local serving certificate's name for the aggregator.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import kubernetes
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from multidict import CIMultiDict, CIMultiDictProxy

from corral.cli.run import _front_proxy
from corral.client.pki import KeyPair, issue, new_ca
from corral.devcluster.processes import free_port
from corral.serving.auth import Caller, Unauthenticated
from corral.serving.certs import ensure_serving_certificate
from corral.serving.frontproxy import FrontProxy
from corral.serving.server import ReadServer

FRONT = new_ca("front-proxy-ca")
OTHER = new_ca("some-other-ca")


def der(pair: KeyPair) -> bytes:
    return x509.load_pem_x509_certificate(pair.cert_pem).public_bytes(serialization.Encoding.DER)


def client_cert(ca: KeyPair, common_name: str = "front-proxy-client") -> KeyPair:
    return issue(ca, common_name, client=True)


def cert_with(ca: KeyPair, common_name: str, *, usages: list[x509.ObjectIdentifier] | None,
              not_after: datetime | None = None) -> bytes:
    """A certificate from `ca` with these extended key usages (None: no such extension) and expiry."""
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    now = datetime.now(UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
               .issuer_name(ca_cert.subject).public_key(ec.generate_private_key(ec.SECP256R1()).public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(days=2))
               .not_valid_after(not_after or now + timedelta(days=1)))
    if usages is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


def headers(*pairs: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


@pytest.fixture
def front(tmp_path: Path) -> FrontProxy:
    (ca := tmp_path / "front-proxy-ca.crt").write_bytes(FRONT.cert_pem)
    return FrontProxy(ca)


ASSERTED = headers(("X-Remote-User", "alice"), ("X-Remote-Group", "team"), ("X-Remote-Group", "system:authenticated"))


def test_the_front_proxy_certificate_makes_the_headers_the_caller(front: FrontProxy) -> None:
    assert front.caller(der(client_cert(FRONT)), ASSERTED) == Caller("alice", ("team", "system:authenticated"))
    # Header names are case-insensitive; empty group values are no groups.
    lower = headers(("x-remote-user", "bob"), ("x-remote-group", ""))
    assert front.caller(der(client_cert(FRONT)), lower) == Caller("bob", ())


def test_a_request_naming_nobody_is_left_to_its_bearer_token(front: FrontProxy) -> None:
    assert front.caller(None, headers(("Authorization", "Bearer x"))) is None
    assert front.caller(der(client_cert(FRONT)), headers()) is None


@pytest.mark.parametrize("asserted", [ASSERTED, headers(("X-Remote-Group", "system:masters"))])
def test_a_forged_header_without_a_client_certificate_is_refused(front: FrontProxy,
                                                                 asserted: CIMultiDictProxy[str]) -> None:
    with pytest.raises(Unauthenticated, match="without the front proxy's client certificate"):
        front.caller(None, asserted)


@pytest.mark.parametrize(("certificate", "why"), [
    (lambda: der(client_cert(OTHER)), "is not a requestheader CA"),
    (lambda: der(client_cert(FRONT, "someone-else")), "common name 'someone-else' is not one of front-proxy-client"),
    (lambda: cert_with(FRONT, "front-proxy-client", usages=[ExtendedKeyUsageOID.SERVER_AUTH]),
     "not for client authentication"),
    (lambda: cert_with(FRONT, "front-proxy-client", usages=None,
                       not_after=datetime.now(UTC) - timedelta(days=1)), "not valid at this time"),
    (lambda: b"not a certificate", "cannot be read"),
])
def test_a_client_certificate_that_is_not_the_front_proxys_is_refused(front: FrontProxy, certificate: Any,
                                                                      why: str) -> None:
    with pytest.raises(Unauthenticated, match=why):
        front.caller(certificate(), ASSERTED)


def test_the_front_proxy_must_name_a_user(front: FrontProxy) -> None:
    with pytest.raises(Unauthenticated, match="named no user"):
        front.caller(der(client_cert(FRONT)), headers(("X-Remote-User", ""), ("X-Remote-Group", "team")))


def test_allowed_names_headers_and_bundles_as_the_cluster_publishes_them() -> None:
    second = new_ca("second-front-proxy-ca")
    # No allowed names: any name the CA signed (Kubernetes' meaning of an empty --requestheader-allowed-names).
    anyone = FrontProxy(FRONT.cert_pem + second.cert_pem, [], username_headers=["X-User"], group_headers=["X-Groups"])
    asserted = headers(("X-User", "carol"), ("X-Groups", "g"))
    assert anyone.caller(der(client_cert(second, "aggregator")), asserted) == Caller("carol", ("g",))
    assert anyone.caller(der(client_cert(FRONT, "other")), asserted) == Caller("carol", ("g",))
    with pytest.raises(Unauthenticated):
        anyone.caller(der(client_cert(OTHER)), asserted)
    # A certificate without extended key usages may authenticate anything, clients too.
    assert anyone.caller(cert_with(FRONT, "x", usages=None), asserted) == Caller("carol", ("g",))


def test_a_ca_file_without_a_certificate_is_refused(tmp_path: Path) -> None:
    (empty := tmp_path / "ca.crt").write_text("nothing here\n")
    with pytest.raises(ValueError, match="holds no PEM certificate"):
        FrontProxy(empty)


# The real server over TLS ----------------------------------------------------------------------------------


@dataclass
class StandInReviews:
    """The API server's answers: one known token, and nobody may do anything (so a 403 names the caller)."""

    token: str = "good-token"
    asked: list[tuple[Caller, str]] = field(default_factory=list)

    async def caller(self, token: str) -> Caller:
        if token != self.token:
            raise Unauthenticated("the API server does not accept this token")
        return Caller("direct-user", ("system:authenticated",))

    async def may(self, caller: Caller, verb: str, namespace: str | None, device: str | None = None) -> bool:
        self.asked.append((caller, verb))
        return False


class NoDevices:
    def view(self, namespace: str, name: str) -> None:
        return None

    def rings(self, device_id: str) -> dict[str, Any]:
        return {}


@dataclass
class Served:
    url: str
    ca_file: Path
    reviews: StandInReviews
    files: Path


def _serve(tmp: Path, front_proxy: FrontProxy | None) -> Iterator[Served]:
    serving_ca = new_ca("serving-ca")
    pair = issue(serving_ca, "corral-controller", server_names=("127.0.0.1",))
    (cert := tmp / "serving.crt").write_bytes(pair.cert_pem)
    (key := tmp / "serving.key").write_bytes(pair.key_pem)
    (ca := tmp / "serving-ca.crt").write_bytes(serving_ca.cert_pem)
    reviews = StandInReviews()
    port = free_port()
    server = ReadServer(reviews, tmp / "audit", port, str(cert), str(key), host="127.0.0.1",
                        source=NoDevices(), front_proxy=front_proxy)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    try:
        yield Served(f"https://127.0.0.1:{port}", ca, reviews, tmp)
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("frontproxy")
    (ca := tmp / "front-proxy-ca.crt").write_bytes(FRONT.cert_pem)
    yield from _serve(tmp, FrontProxy(ca))


@pytest.fixture(scope="module")
def served_without_front_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("no-frontproxy"), None)


def get(served: Served, path: str, headers: dict[str, str] | None = None,
        client: KeyPair | None = None) -> tuple[int, dict[str, Any]]:
    context = ssl.create_default_context(cafile=str(served.ca_file))
    if client is not None:
        (cert := served.files / "client.crt").write_bytes(client.cert_pem)
        (key := served.files / "client.key").write_bytes(client.key_pem)
        context.load_cert_chain(str(cert), str(key))
    request = urllib.request.Request(served.url + path, headers=headers or {})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


DEVICE = "/apis/readings.corral.dev/v1alpha1/namespaces/home/devices/lamp"


def test_a_forged_header_over_tls_without_a_certificate_gets_401(served: Served) -> None:
    status, body = get(served, DEVICE, {"X-Remote-User": "system:admin", "X-Remote-Group": "system:masters"})
    assert status == 401 and "front proxy" in body["message"], body
    # A valid bearer token does not launder the forged header either.
    status, _ = get(served, DEVICE, {"X-Remote-User": "system:admin", "Authorization": "Bearer good-token"})
    assert status == 401


def test_a_certificate_of_another_ca_is_refused_in_the_handshake(served: Served) -> None:
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        get(served, DEVICE, {"X-Remote-User": "system:admin"}, client=client_cert(OTHER))


def test_the_front_proxys_certificate_with_another_name_gets_401(served: Served) -> None:
    status, body = get(served, DEVICE, {"X-Remote-User": "system:admin"}, client=client_cert(FRONT, "intruder"))
    assert status == 401 and "'intruder'" in body["message"], body


def test_through_the_front_proxy_the_headers_name_the_caller(served: Served) -> None:
    served.reviews.asked.clear()
    status, body = get(served, DEVICE, {"X-Remote-User": "alice", "X-Remote-Group": "team"}, client=client_cert(FRONT))
    assert status == 403 and "alice may not" in body["message"], body
    assert served.reviews.asked == [(Caller("alice", ("team",)), "listen")]


def test_direct_callers_bring_a_bearer_token_and_no_certificate(served: Served) -> None:
    served.reviews.asked.clear()
    status, body = get(served, DEVICE, {"Authorization": "Bearer good-token"})
    assert status == 403 and "direct-user may not" in body["message"], body
    assert get(served, DEVICE)[0] == 401
    assert get(served, DEVICE, {"Authorization": "Bearer bad"})[0] == 401
    # The front proxy's certificate alone names nobody: the token still decides.
    assert get(served, DEVICE, client=client_cert(FRONT))[0] == 401


def test_discovery_answers_anyone(served: Served) -> None:
    status, body = get(served, "/apis/readings.corral.dev/v1alpha1")
    assert status == 200 and body["groupVersion"] == "readings.corral.dev/v1alpha1", body


def test_without_a_front_proxy_no_header_is_believed(served_without_front_proxy: Served) -> None:
    status, body = get(served_without_front_proxy, DEVICE, {"X-Remote-User": "system:admin",
                                                            "Authorization": "Bearer good-token"})
    assert status == 401 and "trusts no front proxy" in body["message"], body
    assert get(served_without_front_proxy, DEVICE, {"Authorization": "Bearer good-token"})[0] == 403


# `corral run`'s flags --------------------------------------------------------------------------------------


class PublishedConfigMap:
    """kubernetes.client.CoreV1Api as `corral run --requestheader-from-cluster` uses it."""

    data: dict[str, str] | None = None
    status: int | None = None

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        assert (namespace, name) == ("kube-system", "extension-apiserver-authentication")
        if self.status is not None:
            raise kubernetes.client.ApiException(status=self.status, reason="Forbidden")
        return kubernetes.client.V1ConfigMap(data=self.data)


def test_the_front_proxy_from_the_cluster_is_what_kube_apiserver_published(monkeypatch: pytest.MonkeyPatch) -> None:
    published = PublishedConfigMap()
    monkeypatch.setattr(kubernetes.client, "CoreV1Api", lambda: published)
    published.data = {"client-ca-file": OTHER.cert_pem.decode(),
                      "requestheader-client-ca-file": FRONT.cert_pem.decode(),
                      "requestheader-allowed-names": '["front-proxy-client"]',
                      "requestheader-username-headers": '["X-Remote-User"]',
                      "requestheader-group-headers": '["X-Remote-Group"]',
                      "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]'}
    front = _front_proxy(None, "ignored", True)
    assert front is not None and front.allowed_names == {"front-proxy-client"}
    assert front.caller(der(client_cert(FRONT)), ASSERTED) == Caller("alice", ("team", "system:authenticated"))
    with pytest.raises(Unauthenticated):
        front.caller(der(client_cert(OTHER)), ASSERTED)  # the cluster's client CA is not the front proxy's
    # An API server without an aggregation layer: no front proxy (headers refused), the controller still runs.
    published.data = {"client-ca-file": OTHER.cert_pem.decode()}
    assert _front_proxy(None, "", True) is None
    published.data = {**published.data, "requestheader-client-ca-file": FRONT.cert_pem.decode(),
                      "requestheader-allowed-names": "front-proxy-client"}
    with pytest.raises(click.ClickException, match="not a JSON list"):
        _front_proxy(None, "", True)
    published.status = 403
    with pytest.raises(click.ClickException, match="extension-apiserver-authentication-reader"):
        _front_proxy(None, "", True)


def test_the_front_proxy_from_a_file_with_its_allowed_names(tmp_path: Path) -> None:
    (ca := tmp_path / "ca.crt").write_bytes(FRONT.cert_pem)
    front = _front_proxy(str(ca), "front-proxy-client, aggregator", False)
    assert front is not None and front.allowed_names == {"front-proxy-client", "aggregator"}
    assert _front_proxy(str(ca), "", False).allowed_names == frozenset()
    assert _front_proxy(None, "front-proxy-client", False) is None
    (ca := tmp_path / "empty.crt").write_text("")
    with pytest.raises(click.BadParameter, match="holds no PEM certificate"):
        _front_proxy(str(ca), "front-proxy-client", False)


def test_the_local_serving_certificate_is_for_the_name_the_aggregator_checks(tmp_path: Path) -> None:
    made = ensure_serving_certificate(tmp_path)
    cert = x509.load_pem_x509_certificate(made.cert_file.read_bytes())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(made.ca_file.read_bytes()))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "corral-readings.corral-system.svc" in names.get_values_for_type(x509.DNSName)
    assert ensure_serving_certificate(tmp_path) == made and made.cert_file.read_bytes() == cert.public_bytes(
        serialization.Encoding.PEM), "kept once made"
    # One made before the name was added (localhost only) is made again, with a CA of its own.
    old_ca = new_ca("old")
    made.cert_file.write_bytes(issue(old_ca, "corral-controller", server_names=("localhost",)).cert_pem)
    made.ca_file.write_bytes(old_ca.cert_pem)
    ensure_serving_certificate(tmp_path)
    assert made.ca_file.read_bytes() != old_ca.cert_pem
    renewed = x509.load_pem_x509_certificate(made.cert_file.read_bytes())
    assert "corral-readings.corral-system.svc" in renewed.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)

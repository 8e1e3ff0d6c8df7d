"""What `corral secrets ensure` puts in a Secret: made once, kept after, completed when a key is missing, and a
new certificate from the same CA only when the names change or it is about to end. No cluster here: the
create-or-read against the API server is in tests/integration/test_chart.py."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from corral.cli.main import cli
from corral.client.secret_material import MaterialError, Wanted, certificate_names, fill

CHART_TEMPLATES = Path(__file__).resolve().parents[2] / "charts" / "corral" / "templates"


def test_keys_and_passwords_are_made_once_and_kept() -> None:
    wanted = Wanted("keys", ed25519=["controller.pem"], passwords=["password"])
    first = fill(wanted, None)
    assert first is not None and set(first) == {"controller.pem", "password"}
    assert isinstance(serialization.load_pem_private_key(first["controller.pem"], None), Ed25519PrivateKey)
    assert re.fullmatch(rb"[-_A-Za-z0-9]{32}", first["password"])
    assert fill(wanted, first) is None, "nothing to write when everything is there"
    # A key asked for later (the gateway enabled) is added; the ones handed out already stay byte for byte.
    more = fill(Wanted("keys", ed25519=["controller.pem", "gateway.pem"], passwords=["password"]), first)
    assert more is not None and {k: more[k] for k in first} == first and more["gateway.pem"] != first["controller.pem"]


def test_a_server_certificate_is_for_its_names_and_kept_while_they_stay() -> None:
    wanted = Wanted("tls", server_names=["svc.ns.svc", "localhost", "127.0.0.1", "::1"])
    made = fill(wanted, None)
    assert made is not None and set(made) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    x509.load_pem_x509_certificate(made["tls.crt"]).verify_directly_issued_by(
        x509.load_pem_x509_certificate(made["ca.crt"]))
    assert certificate_names(made["tls.crt"]) == {"svc.ns.svc", "localhost", "127.0.0.1", "::1"}
    assert fill(wanted, made) is None
    assert fill(Wanted("tls", server_names=["svc.ns.svc", "localhost", "127.0.0.1", "0:0::1"]), made) is None
    renamed = fill(Wanted("tls", server_names=["svc.ns.svc", "broker.lan"]), made)
    assert renamed is not None and (renamed["ca.crt"], renamed["ca.key"]) == (made["ca.crt"], made["ca.key"])
    assert certificate_names(renamed["tls.crt"]) == {"svc.ns.svc", "broker.lan"}
    # Within 30 days of its end it is made again, from the same CA; 40 days before, it is kept.
    end = x509.load_pem_x509_certificate(made["tls.crt"]).not_valid_after_utc
    assert fill(wanted, made, now=end - timedelta(days=40)) is None
    renewed = fill(wanted, made, now=end - timedelta(days=10))
    assert renewed is not None and renewed["ca.crt"] == made["ca.crt"] and renewed["tls.crt"] != made["tls.crt"]


@pytest.mark.parametrize(("wanted", "current", "message"), [
    (Wanted("x", ed25519=["a.pem"], server_names=["a"]), None, "a Secret of their own"),
    (Wanted("x", passwords=["bad key"]), None, "is not a Secret data key"),
    (Wanted("x", passwords=["p", "p"]), None, "asked for twice"),
    (Wanted("x", server_names=["10.0.0.1"]), None, "at least one DNS name"),
    (Wanted("x", server_names=["a"]), {"tls.crt": b"-", "tls.key": b"-"}, "not made by Corral"),
])
def test_what_cannot_be_met_is_refused_with_the_reason(wanted: Wanted, current: dict[str, bytes] | None,
                                                      message: str) -> None:
    with pytest.raises(MaterialError, match=message):
        fill(wanted, current, datetime.now(UTC))


@pytest.mark.parametrize(("args", "message"), [
    ([], "nothing to ensure"),
    (["--password", "nokey"], "is not SECRET/KEY"),
    (["--password", "a/p", "--write", "b/p=/tmp/x"], "b is not a Secret this command ensures"),
    (["--password", "a/p", "--write", "a/q=/tmp/x"], "a will hold p, not q"),
    (["--password", "a/p", "--publish-ca", "a=configmap/c"], "a is not a --server-cert Secret"),
    (["--password", "a/p", "--keep", "b"], "b: not a Secret this command ensures"),
])
def test_the_ensure_command_refuses_unclear_requests_before_it_connects(args: list[str], message: str) -> None:
    done = CliRunner().invoke(cli, ["secrets", "ensure", "--kubeconfig", "/nonexistent", "-n", "ns", *args])
    assert done.exit_code == 2 and message in done.output, done.output


def test_the_chart_templates_generate_nothing_secret_and_put_no_secret_in_an_environment() -> None:
    """A key, certificate or password a template makes lands in every release record and is new at every
    render; a `lookup` of a Secret only hides that under `helm install`. The components make them at run time
    instead. (The chart looks up a kept Namespace and claim, never a Secret: corral.ownsOrAbsent.)"""
    generators = re.compile(r"\b(genPrivateKey|genCA|genCAWithKey|genSelfSignedCert|genSignedCert|randAlphaNum|randAlpha|"
                            r"randAscii|randNumeric|randBytes|uuidv4)\b|\blookup\s+\S+\s+\"Secret\"")
    found = [f"{path.name}:{n}: {line.strip()}" for path in sorted(CHART_TEMPLATES.iterdir())
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if generators.search(line) or "secretKeyRef" in line]
    assert found == []

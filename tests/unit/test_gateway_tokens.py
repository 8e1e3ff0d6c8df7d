"""The HTTP gateway's own token check (gateway/identity.check_claims): a JWT, issued for its audience, not
expired; and the 401 that says which of these failed (gateway/serve.RequireToken), without any API server."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import kubernetes
import pytest
from starlette.testclient import TestClient

from corral.api.codes import GATEWAY_AUDIENCE
from corral.gateway.identity import EXPIRY_LEEWAY_S, KubeTokenVerifier, TokenRefused, check_claims, jwt_claims

HINT = f"kubectl create token SA --audience {GATEWAY_AUDIENCE}"
NOW = 1_800_000_000.0


def part(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def jwt(claims: dict[str, Any], header: Any = None) -> str:
    """A JWT as the API server would shape it; the signature is nonsense, which check_claims does not look at."""
    return f"{part(header or {'alg': 'RS256', 'kid': 'k'})}.{part(claims)}.c2lnbmF0dXJl"


def claims(**extra: Any) -> dict[str, Any]:
    return {"iss": "https://kubernetes.default.svc.cluster.local", "sub": "system:serviceaccount:home:agent",
            "aud": [GATEWAY_AUDIENCE], "iat": NOW - 60, "exp": NOW + 3600, **extra}


def refusal(token: str, now: float = NOW) -> str:
    with pytest.raises(TokenRefused) as refused:
        check_claims(token, GATEWAY_AUDIENCE, now)
    return str(refused.value)


@pytest.mark.parametrize("aud", [[GATEWAY_AUDIENCE], GATEWAY_AUDIENCE])
def test_a_jwt_for_the_audience_passes_whether_aud_is_a_string_or_a_list(aud: Any) -> None:
    assert check_claims(jwt(claims(aud=aud)), GATEWAY_AUDIENCE, NOW)["aud"] == aud


def test_a_jwt_that_names_other_audiences_too_was_not_issued_for_the_gateway() -> None:
    said = refusal(jwt(claims(aud=["https://kubernetes.default.svc.cluster.local", GATEWAY_AUDIENCE])))
    assert said.startswith("the bearer token was not issued for this gateway alone: it also names "
                           "https://kubernetes.default.svc.cluster.local")


@pytest.mark.parametrize("aud", [["https://kubernetes.default.svc.cluster.local"], "corral-gateway-2", [], None, 7,
                                 ["CORRAL-GATEWAY"], [["corral-gateway"]]])
def test_a_jwt_for_another_audience_or_none_is_refused(aud: Any) -> None:
    said = refusal(jwt(claims(aud=aud)))
    assert said.startswith("the bearer token was not issued for this gateway") and said.endswith(
        f"not {GATEWAY_AUDIENCE}")
    if aud == ["https://kubernetes.default.svc.cluster.local"]:
        assert "its audience is https://kubernetes.default.svc.cluster.local" in said


def test_an_expired_jwt_is_refused_after_the_leeway_and_not_before() -> None:
    exp = NOW - 600
    assert "expired at 2027-01-15T07:50:00Z" in refusal(jwt(claims(exp=exp)))
    assert check_claims(jwt(claims(exp=NOW - EXPIRY_LEEWAY_S + 1)), GATEWAY_AUDIENCE, NOW)
    assert "expired" in refusal(jwt(claims(exp=NOW - EXPIRY_LEEWAY_S)))
    assert check_claims(jwt({"aud": GATEWAY_AUDIENCE}), GATEWAY_AUDIENCE, NOW) == {"aud": GATEWAY_AUDIENCE}


@pytest.mark.parametrize("exp", ["1800000000", True, [1], float("inf"), float("nan")])
def test_an_exp_that_is_no_number_is_refused(exp: Any) -> None:
    assert refusal(jwt(claims(exp=exp))) == "the bearer token's exp claim is not a number"


def test_a_null_exp_claims_no_expiry_and_leaves_it_to_the_api_server() -> None:
    assert check_claims(jwt(claims(exp=None)), GATEWAY_AUDIENCE, NOW)


@pytest.mark.parametrize("token", [
    "not-a-kubernetes-token", "0123456789abcdef0123456789abcdef", "a.b", "a.b.c.d", "..", "a..c",
    f"{part({'alg': 'RS256'})}.{part(claims())}.", f"{part({'alg': 'RS256'})}.{part(claims())}.si=g",
    f"{part({'alg': 'RS256'})}.{part(claims())}.sig extra", f"{part({'alg': 'RS256'})}+.{part(claims())}.sig",
])
def test_what_is_not_a_jwt_is_refused_as_such(token: str) -> None:
    assert refusal(token).startswith("the bearer token is not a JWT")


@pytest.mark.parametrize("header, payload", [
    (part({"alg": "RS256"}), part([GATEWAY_AUDIENCE])),  # JSON, but no object
    (part({"alg": "RS256"}), "bm90IGpzb24"),  # base64url of "not json"
    (part("RS256"), part(claims())),
    ("x", part(claims())),  # a length base64 cannot have
    (part({"alg": "RS256"}), base64.urlsafe_b64encode(b"\xff\xfe{}").decode().rstrip("=")),  # not UTF-8
])
def test_a_jwt_whose_header_or_payload_is_no_json_object_is_refused(header: str, payload: str) -> None:
    with pytest.raises(TokenRefused, match="header and payload are not base64url-encoded JSON objects"):
        jwt_claims(f"{header}.{payload}.c2ln")


class Reviewed(KubeTokenVerifier):
    """The verifier with its SelfSubjectReview replaced by a record of the tokens it would have sent."""

    def __init__(self, now: list[float], accept: bool = True) -> None:
        config = kubernetes.client.Configuration()
        config.host = "https://127.0.0.1:1"
        super().__init__(config, clock=lambda: now[0])
        self.reviewed: list[str] = []
        self.accept = accept

    def _review(self, token: str) -> str | None:
        self.reviewed.append(token)
        return "system:serviceaccount:home:agent" if self.accept else None


def test_the_verifier_reviews_only_tokens_that_pass_and_its_cache_lets_no_expired_one_through() -> None:
    now = [NOW]
    verifier = Reviewed(now)
    good = jwt(claims(exp=NOW + 20))
    access = asyncio.run(verifier.verify_token(good))
    assert access is not None and access.client_id == "system:serviceaccount:home:agent"
    assert asyncio.run(verifier.verify_token(good)) == access and verifier.reviewed == [good]  # cached
    now[0] = NOW + 20 + EXPIRY_LEEWAY_S  # within the cache's minute, past exp and the leeway
    assert asyncio.run(verifier.verify_token(good)) is None
    assert verifier.reviewed == [good] and not verifier._cache, "refused before the cache; the entry dropped"
    for refused in (jwt(claims(aud=["https://kubernetes.default.svc.cluster.local"])), jwt(claims(exp=NOW)),
                    "static-token"):
        assert asyncio.run(verifier.verify_token(refused)) is None
    assert verifier.reviewed == [good], "no token the gateway refuses itself reaches the API server"


def test_the_refusal_says_what_was_wrong_and_how_to_mint_a_token_for_the_gateway() -> None:
    verifier = Reviewed([NOW], accept=False)
    wrong = jwt(claims(aud=["https://kubernetes.default.svc.cluster.local"]))
    said = {name: verifier.refusal(token) for name, token in (
        ("none", None), ("static", "static-token"), ("wrong", wrong), ("expired", jwt(claims(exp=NOW - 3600))),
        ("review", jwt(claims())))}
    assert all(text.endswith(f"{HINT} -n NS") for text in said.values()), said
    assert said["none"].startswith("no bearer token")
    assert said["static"].startswith("the bearer token is not a JWT")
    assert said["wrong"].startswith("the bearer token was not issued for this gateway: its audience is "
                                    "https://kubernetes.default.svc.cluster.local, not corral-gateway.")
    assert said["expired"].startswith("the bearer token expired at 2027-01-15T07:00:00Z")
    assert said["review"].startswith("the API server did not accept the bearer token")
    assert f"--api-audiences lacks {GATEWAY_AUDIENCE}" in said["review"]


@pytest.fixture(scope="module")
def app_client() -> TestClient:
    from corral.gateway.serve import http_app  # the SDK's server stack

    config = kubernetes.client.Configuration()
    config.host = "https://127.0.0.1:1"  # nothing listens: every refusal below happens before any API call
    app = http_app(config, ["home"], public_url="http://127.0.0.1:8000/mcp", issuer_url="https://127.0.0.1:1",
                   allowed_hosts=[], wait_s=1)
    return TestClient(app, base_url="http://127.0.0.1:8000")


@pytest.mark.parametrize("token, problem", [
    (None, "no bearer token"),
    ("static-token", "the bearer token is not a JWT"),
    (jwt(claims(aud=["https://kubernetes.default.svc.cluster.local"])), "was not issued for this gateway"),
    (jwt(claims(exp=time.time() - 3600)), "the bearer token expired at"),
    (jwt(claims(aud=['quote"back\\slash\nnewline'])), "its audience is quote'back?slash?newline, not"),
])
def test_every_refusal_is_a_401_challenge_naming_the_metadata_and_the_kubectl_command(
        app_client: TestClient, token: str | None, problem: str) -> None:
    headers = {"Accept": "application/json, text/event-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    answer = app_client.post("/mcp", headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert answer.status_code == 401
    challenge = answer.headers["WWW-Authenticate"]
    assert challenge.startswith('Bearer resource_metadata="http://127.0.0.1:8000/.well-known/oauth-protected-resource/mcp", '
                                'error="invalid_token", error_description="')
    description = challenge.split('error_description="', 1)[1]
    assert description.endswith('"') and '"' not in description[:-1] and "\\" not in description
    assert all(" " <= c <= "~" for c in challenge)
    body = answer.json()
    assert body["error"] == "invalid_token" and body["error_description"] == description[:-1]
    assert problem in body["error_description"] and HINT in body["error_description"]


def test_the_protected_resource_metadata_names_the_public_url_and_the_issuer(app_client: TestClient) -> None:
    metadata = app_client.get("/.well-known/oauth-protected-resource/mcp").json()
    assert metadata["resource"] == "http://127.0.0.1:8000/mcp"
    assert [url.rstrip("/") for url in metadata["authorization_servers"]] == ["https://127.0.0.1:1"]

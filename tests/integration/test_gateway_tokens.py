"""Over HTTP the gateway accepts only tokens issued for its audience (`corral-gateway`), against the real API
server: an audience-bound ServiceAccount token works; one for another audience only, an expired one, the
plane's static tokens (no JWTs) get 401 with the protected-resource metadata and the kubectl command to mint a
right one. One namespace, device and gateway for the module: no controller, no firmware."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from corral.api.codes import GATEWAY_AUDIENCE
from corral.client.enroll import enroll
from corral.devcluster.plane import Plane
from tests.gateway_harness import HttpGateway, gateway_token, http_client
from tests.harness import api_client, apply_yaml, fresh_namespace, service_account_token, wait_until_allowed

pytestmark = pytest.mark.integration

HINT = f"kubectl create token SA --audience {GATEWAY_AUDIENCE}"
API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"  # the plane's first --api-audiences

READER = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: agent}}
rules:
- {{apiGroups: [corral.dev], resources: [devices], verbs: [get, list, watch, read]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: agent}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: agent}}
subjects: [{{kind: ServiceAccount, name: agent, namespace: {ns}}}]
"""


@dataclass
class Served:
    plane: Plane
    namespace: str
    admin: kubernetes.client.ApiClient
    gateway: HttpGateway
    token: str  # the agent's, for the gateway's audience


@pytest.fixture(scope="module")
def served(plane: Plane, corral_api: kubernetes.client.ApiClient, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Served]:
    with fresh_namespace(corral_api, "gateway-tokens") as namespace:
        apply_yaml(corral_api, READER.format(ns=namespace), namespace)
        enroll(corral_api, namespace, "porch-light", "light")
        token = gateway_token(corral_api, namespace, "agent")
        wait_until_allowed(api_client(plane, token=token), "read", namespace, "devices")
        gateway = HttpGateway(plane, namespace, tmp_path_factory.mktemp("gateway-tokens") / "gateway.log")
        try:
            yield Served(plane, namespace, corral_api, gateway, token)
        finally:
            gateway.stop()


def refused(url: str, token: str | None) -> tuple[str, str]:
    """POST a ping with this bearer token, which must get 401: (the WWW-Authenticate challenge, the description)."""
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode(), headers)
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=10)
    assert answer.value.code == 401
    body = json.load(answer.value)
    assert body["error"] == "invalid_token"
    return answer.value.headers["WWW-Authenticate"], body["error_description"]


def claims_of(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def expired_copy(token: str) -> str:
    """The same JWT (header, signature, audience) with an `exp` an hour ago: what the API server signed, changed."""
    header, _, signature = token.split(".")
    claims = claims_of(token)
    claims["exp"] = int(time.time()) - 3600
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"{header}.{forged}.{signature}"


def test_a_token_for_the_gateway_audience_lists_and_calls_the_tools(served: Served) -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        async with http_client(served.gateway.url, served.token) as agent:
            tools = [t.name for t in (await agent.list_tools()).tools]
            devices = (await agent.call_tool("iot.list_devices", {})).structured_content["devices"]
            return tools, [d["device_id"] for d in devices]

    tools, devices = asyncio.run(scenario())
    assert "iot.list_devices" in tools and devices == [f"{served.namespace}/porch-light"]
    assert claims_of(served.token)["aud"] == [GATEWAY_AUDIENCE]


def test_a_token_requested_without_an_audience_is_not_one_for_the_gateway(served: Served) -> None:
    """What Kubernetes does (TokenRequest audiences: [], as a Pod's default token): the token names every
    --api-audiences entry, the gateway's among them; it was not issued for the gateway, which refuses it."""
    unnamed = service_account_token(served.admin, served.namespace, "agent")
    assert set(claims_of(unnamed)["aud"]) == {API_AUDIENCE, GATEWAY_AUDIENCE}
    challenge, said = refused(served.gateway.url, unnamed)
    assert 'resource_metadata="' in challenge
    assert said.startswith(f"the bearer token was not issued for this gateway alone: it also names {API_AUDIENCE}")


def test_every_token_not_issued_for_the_gateway_gets_401_with_the_metadata_and_the_kubectl_command(
        served: Served) -> None:
    wrong_audience = service_account_token(served.admin, served.namespace, "agent", audience=API_AUDIENCE)
    review = kubernetes.client.AuthenticationV1Api(api_client(served.plane, token=wrong_audience)
                                                   ).create_self_subject_review({})
    assert review.status.user_info.username == f"system:serviceaccount:{served.namespace}:agent", \
        "a good token for the API server, only not for the gateway"
    metadata_url = served.gateway.url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
    cases = {
        "no token": (None, "no bearer token"),
        "no JWT (the plane's static token)": (served.plane.user_token, "the bearer token is not a JWT"),
        "no JWT (the admin's)": (served.plane.admin_token, "the bearer token is not a JWT"),
        "another audience": (wrong_audience, "the bearer token was not issued for this gateway: its audience is "
                                             f"{API_AUDIENCE}, not {GATEWAY_AUDIENCE}"),
        "expired": (expired_copy(served.token), "the bearer token expired at"),
    }
    for case, (token, problem) in cases.items():
        challenge, description = refused(served.gateway.url, token)
        assert challenge.startswith(f'Bearer resource_metadata="{metadata_url}", error="invalid_token"'), case
        assert problem in description and HINT in description, (case, description)
        assert f'error_description="{description}"' in challenge, case
    with urllib.request.urlopen(metadata_url, timeout=10) as response:
        assert json.load(response)["resource"] == served.gateway.url
    log = served.gateway.log_path.read_text()
    assert "refused a bearer token: the bearer token expired at" in log
    assert "the API server answered" not in log, "the gateway refused each of them itself, before any review"


def test_the_audience_is_the_flag_s_and_the_api_server_must_accept_it_too(served: Served, tmp_path: Path) -> None:
    """`--audience corral-other`: a corral-gateway token is now another audience's; a corral-other token passes
    the gateway's check, but this API server (--api-audiences without it) refuses it in the review."""
    other = HttpGateway(served.plane, served.namespace, tmp_path / "other.log", "--audience", "corral-other")
    try:
        _, description = refused(other.url, served.token)
        assert "its audience is corral-gateway, not corral-other" in description
        assert "kubectl create token SA --audience corral-other" in description
        _, description = refused(other.url, service_account_token(served.admin, served.namespace, "agent",
                                                                  audience="corral-other"))
        assert description.startswith("the API server did not accept the bearer token") and \
            "--api-audiences lacks corral-other" in description, description
    finally:
        other.stop()
    assert "the API server answered 401" in (tmp_path / "other.log").read_text()

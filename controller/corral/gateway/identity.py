"""Who is calling, and a Kubernetes client that acts as them.

The gateway has no Kubernetes rights of its own. Over stdio the caller is the
local kubeconfig's user; over HTTP every request carries a Kubernetes bearer
token and every API call for that request is made with that very token. A
token is checked with a SelfSubjectReview made with the token itself: the API
server authenticates it and names its user, and the gateway needs no
TokenReview right for that.

Over HTTP the gateway accepts only tokens issued for it (the MCP authorization
spec: a server must refuse tokens meant for anyone else): JWTs whose `aud`
names its audience (`corral-gateway` unless `--audience` says otherwise,
minted with `kubectl create token SA --audience corral-gateway`). A
SelfSubjectReview does not tell the audience, so the gateway reads the claim
itself, before the review; the API server must list the audience in its
`--api-audiences`, or it refuses the very token in the review.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import kubernetes
from mcp.server.auth.provider import AccessToken

from corral.api.codes import GATEWAY_AUDIENCE
from corral.gateway.blocking import blocking
from corral.gateway.following import IntentFollower
from corral.kube.client import AsyncApi

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Caller:
    """One identity: `key` selects its cache, `new_client()` builds a client acting as it."""

    key: str
    base: kubernetes.client.Configuration
    token: str | None = None  # None: the base configuration's own credentials (the kubeconfig user)
    impersonate: tuple[str, str | None] | None = None  # (user, group), for `corral tools --as`
    username: str | None = None  # as the token was authenticated (HTTP), for per-caller bounds

    def configuration(self) -> kubernetes.client.Configuration:
        config = copy.copy(self.base)
        if self.token is not None:
            config.api_key = {"authorization": f"Bearer {self.token}"}
            config.api_key_prefix = {}
        return config

    def authorization(self) -> str | None:
        """The Authorization header this identity sends, if it is a bearer token (None: a client certificate)."""
        if self.impersonate is not None:
            return None  # an impersonated view must not reach the controller with the impersonator's token
        config = self.configuration()
        return config.get_api_key_with_prefix("authorization", alias="BearerToken") or None

    def headers(self) -> dict[str, str]:
        if self.impersonate is None:
            return {}
        user, group = self.impersonate
        # The official client keeps one value per header: one group.
        return {"Impersonate-User": user, **({"Impersonate-Group": group} if group else {})}

    def new_client(self) -> kubernetes.client.ApiClient:
        client = kubernetes.client.ApiClient(self.configuration())
        for header, value in self.headers().items():
            client.set_default_header(header, value)
        return client

    def new_api(self) -> AsyncApi:
        """The asynchronous client acting as this caller (kube.client: on the event loop, no thread)."""
        return AsyncApi(self.configuration(), self.headers())

    def new_follower(self, may_watch: Callable[[str], bool], api: AsyncApi | None = None) -> IntentFollower:
        """Asynchronous calls and watches of Intents, as this caller (with `api`, else a client of its own);
        `may_watch(namespace)` says whether it may list and watch Intents there."""
        return IntentFollower(api or self.new_api(), may_watch)


def kubeconfig_configuration(kubeconfig: str | None, context: str | None) -> kubernetes.client.Configuration:
    """The cluster and credentials of a kubeconfig, or of the Pod's ServiceAccount when running in a cluster."""
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=config)
    except kubernetes.config.ConfigException:
        if kubeconfig:
            raise
        kubernetes.config.load_incluster_config(client_configuration=config)
    return config


def anonymous(config: kubernetes.client.Configuration) -> kubernetes.client.Configuration:
    """The same cluster and CA with every credential removed: callers bring their own token."""
    bare = copy.copy(config)
    bare.api_key = {}
    bare.api_key_prefix = {}
    bare.cert_file = bare.key_file = None
    bare.username = bare.password = ""
    bare.refresh_api_key_hook = None
    return bare


def token_key(token: str) -> str:
    return "token:" + hashlib.sha256(token.encode()).hexdigest()


# Seconds of clock difference allowed between the token's issuer and the gateway when checking `exp`.
EXPIRY_LEEWAY_S: Final = 30.0
_JWT: Final = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")  # compact JWS: header.payload.signature


class TokenRefused(ValueError):
    """A bearer token the gateway refuses without asking the API server; the message says why, for the caller."""


def mint_hint(audience: str) -> str:
    return f"Mint one for this gateway: kubectl create token SA --audience {audience} -n NS"


def _json_part(part: str) -> Any:
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def jwt_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT, read without checking its signature (see check_claims)."""
    if not _JWT.fullmatch(token):
        raise TokenRefused("the bearer token is not a JWT (three base64url parts joined by dots), as a ServiceAccount "
                           "token is; static, bootstrap and other opaque tokens are not accepted")
    header_part, payload_part, _ = token.split(".")
    try:
        header, claims = _json_part(header_part), _json_part(payload_part)
    except ValueError:  # binascii.Error, UnicodeDecodeError and JSONDecodeError are all ValueErrors
        header = claims = None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise TokenRefused("the bearer token is not a JWT: its header and payload are not base64url-encoded JSON objects")
    return claims


def _shown(values: list[Any]) -> str:
    shown = ["".join(c if c.isprintable() else "?" for c in str(v)[:80]) for v in values[:5]]
    return ", ".join(shown) + (", ..." if len(values) > 5 else "")


def check_claims(token: str, audience: str, now: float, leeway_s: float = EXPIRY_LEEWAY_S) -> dict[str, Any]:
    """The token's claims when it is a JWT issued for `audience` alone (its `aud`, a string or a list, names it and
    nothing else) that has not expired at `now` (epoch seconds, `leeway_s` of grace); TokenRefused saying what is
    wrong otherwise.

    Alone, because a token that names other audiences too was not issued for this gateway: Kubernetes gives a
    token requested without an audience (a Pod's default token, a plain `kubectl create token SA`) every entry of
    the API server's --api-audiences, this one among them once the API server accepts it.

    The signature is not checked here, and need not be: a forged claim gains nothing, since every token that
    passes is then reviewed by the API server, which verifies the signature (and the audience, against its
    --api-audiences) before it names any user, and every later API call is made with that same token."""
    claims = jwt_claims(token)
    aud = claims.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if audience not in audiences:
        issued_for = f"its audience is {_shown(audiences)}" if audiences else "it names no audience"
        raise TokenRefused(f"the bearer token was not issued for this gateway: {issued_for}, not {audience}")
    others = [a for a in audiences if a != audience]
    if others:
        raise TokenRefused(f"the bearer token was not issued for this gateway alone: it also names {_shown(others)} "
                           f"(a token requested without an audience names all the API server's); ask for one with "
                           f"only {audience}")
    exp = claims.get("exp")
    if exp is not None:
        if isinstance(exp, bool) or not isinstance(exp, int | float) or not math.isfinite(exp):
            raise TokenRefused("the bearer token's exp claim is not a number")
        if exp + leeway_s <= now:
            try:
                at = datetime.fromtimestamp(exp, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
            except (OverflowError, OSError, ValueError):
                at = f"{exp:g} (epoch seconds)"
            raise TokenRefused(f"the bearer token expired at {at}")
    return claims


class KubeTokenVerifier:
    """MCP SDK TokenVerifier: a token is valid when it is a JWT issued for `audience` that has not expired
    (check_claims), and the API server authenticates it.

    The claims are checked on every request, cached or not; the reviews are cached for `ttl_s` by token
    digest, so a busy agent costs one review a minute; a revoked token keeps working at most that long.
    """

    def __init__(self, base: kubernetes.client.Configuration, audience: str = GATEWAY_AUDIENCE, ttl_s: float = 60.0,
                 max_entries: int = 10_000, clock: Callable[[], float] = time.time) -> None:
        self.base = anonymous(base)
        self.audience = audience
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._cache: dict[str, tuple[float, AccessToken]] = {}

    def check(self, token: str) -> dict[str, Any]:
        return check_claims(token, self.audience, self.clock())

    def refusal(self, token: str | None) -> str:
        """Why a token that verify_token refused (None: no bearer token at all) is refused, and how to mint one."""
        if not token:
            problem = "no bearer token: send the header Authorization: Bearer TOKEN"
        else:
            try:
                self.check(token)
                problem = ("the API server did not accept the bearer token (expired, revoked, its ServiceAccount "
                           f"deleted, issued by another cluster, or the API server's --api-audiences lacks {self.audience})")
            except TokenRefused as refused:
                problem = str(refused)
        return f"{problem}. {mint_hint(self.audience)}"

    async def verify_token(self, token: str) -> AccessToken | None:
        key = token_key(token)
        try:
            self.check(token)  # before the cache: a token cached a minute ago may have expired since
        except TokenRefused as refused:
            log.info("refused a bearer token: %s", refused)
            self._cache.pop(key, None)
            return None
        hit = self._cache.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        username = await blocking(self._review, token)
        if username is None:
            self._cache.pop(key, None)
            return None
        if len(self._cache) >= self.max_entries:
            self._cache.clear()
        # client_id is what the SDK binds an HTTP session to: a session opened with one identity
        # cannot be used with another's token.
        access = AccessToken(token=token, client_id=username, scopes=[], subject=username)
        self._cache[key] = (time.monotonic() + self.ttl_s, access)
        return access

    def _review(self, token: str) -> str | None:
        caller = Caller(token_key(token), self.base, token)
        with caller.new_client() as client:
            try:
                review = kubernetes.client.AuthenticationV1Api(client).create_self_subject_review({})
            except kubernetes.client.ApiException as err:
                if err.status in (401, 403):
                    log.info("refused a bearer token: the API server answered %s (a token for audience %s also needs "
                             "it in the API server's --api-audiences)", err.status, self.audience)
                    return None
                raise
        user = review.status.user_info
        log.info("caller authenticated as %s", user.username)
        return str(user.username)

"""Who is calling, and a Kubernetes client that acts as them.

The gateway has no Kubernetes rights of its own. Over stdio the caller is the
local kubeconfig's user; over HTTP every request carries a Kubernetes bearer
token and every API call for that request is made with that very token. A
token is checked with a SelfSubjectReview made with the token itself: the API
server authenticates it and names its user, and the gateway needs no
TokenReview right for that.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import kubernetes
from mcp.server.auth.provider import AccessToken

from corral.client.asyncapi import AsyncApi
from corral.gateway.blocking import blocking
from corral.gateway.following import IntentFollower

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Caller:
    """One identity: `key` selects its cache, `new_client()` builds a client acting as it."""

    key: str
    base: kubernetes.client.Configuration
    token: str | None = None  # None: the base configuration's own credentials (the kubeconfig user)
    impersonate: tuple[str, str | None] | None = None  # (user, group), for `corral tools --as`

    def configuration(self) -> kubernetes.client.Configuration:
        config = copy.copy(self.base)
        if self.token is not None:
            config.api_key = {"authorization": f"Bearer {self.token}"}
            config.api_key_prefix = {}
        return config

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

    def new_follower(self, may_watch: Callable[[str], bool]) -> IntentFollower:
        """Asynchronous calls and watches of Intents, as this caller; `may_watch(namespace)` says whether it
        may list and watch Intents there."""
        return IntentFollower(AsyncApi(self.configuration(), self.headers()), may_watch)


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


class KubeTokenVerifier:
    """MCP SDK TokenVerifier: a token is valid when the API server authenticates it.

    Results are cached for `ttl_s` by token digest, so a busy agent costs one
    review a minute; a revoked token keeps working at most that long.
    """

    def __init__(self, base: kubernetes.client.Configuration, ttl_s: float = 60.0, max_entries: int = 10_000) -> None:
        self.base = anonymous(base)
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._cache: dict[str, tuple[float, AccessToken]] = {}

    async def verify_token(self, token: str) -> AccessToken | None:
        key = token_key(token)
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
                    log.info("refused a bearer token: the API server answered %s", err.status)
                    return None
                raise
        user = review.status.user_info
        log.info("caller authenticated as %s", user.username)
        return str(user.username)

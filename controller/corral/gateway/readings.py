"""The controller's readings (timestamped samples), fetched with the caller's own identity.

Two ways there, both as the caller: through the API server's aggregation layer (the APIService
`readings.corral.dev`, the default: it works with any credential the API server accepts), or straight to
the controller's HTTPS server (`corral mcp --readings-url URL --readings-ca FILE`), which authenticates the
caller's bearer token with a TokenReview; for clusters, or the local plane, where the APIService is not
routed. Either way the controller decides with SubjectAccessReview (`listen` on the Device) what the caller
may read; the gateway only passes the answer on.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from corral.api.codes import READINGS_PREFIX
from corral.kube.client import ApiError, AsyncApi

TIMEOUT_S = 5.0


class ReadingsUnavailable(Exception):
    """The readings could not be fetched; str() says why, for the model and the person behind it."""


@dataclass(frozen=True)
class Direct:
    url: str
    ca_file: str | None


def path_of(namespace: str, name: str) -> str:
    return f"{READINGS_PREFIX}/namespaces/{quote(namespace, safe='')}/devices/{quote(name, safe='')}"


class Readings:
    """Fetches readings as each caller; one kept-alive connection pool to the controller when direct (a new TLS
    handshake per call would cost more than the controller's answer)."""

    def __init__(self, direct: Direct | None) -> None:
        self.direct = direct
        # Made at first use: the controller may be making its CA file just now.
        self._client: tuple[aiohttp.ClientSession, ssl.SSLContext] | None = None

    async def close(self) -> None:
        if self._client is not None:
            await self._client[0].close()
            self._client = None

    async def fetch(self, api: AsyncApi, authorization: str | None, namespace: str, name: str,
                    metrics: list[str] | None, window_s: float) -> dict[str, Any]:
        """The DeviceReadings document for one Device, as the caller may read it."""
        params = {"window_s": f"{window_s:g}"}
        if metrics:
            params["metrics"] = ",".join(metrics)
        if self.direct is None:
            try:
                return await api.request("GET", path_of(namespace, name), params=params)
            except ApiError as err:
                if err.status == 404 and "no Device" not in err.message:
                    raise ReadingsUnavailable("the API server does not serve readings.corral.dev (no APIService "
                                              "registered); run the gateway with --readings-url") from None
                raise ReadingsUnavailable(f"{err.status}: {err.message}") from None
        if not authorization:
            raise ReadingsUnavailable("the controller's readings need a bearer token, and this identity has none "
                                      "(a client certificate reaches them only through the API server's APIService)")
        if self._client is None:
            try:
                tls = ssl.create_default_context(cafile=self.direct.ca_file)
            except OSError as err:
                raise ReadingsUnavailable(f"cannot read --readings-ca {self.direct.ca_file}: {err}") from None
            self._client = (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)), tls)
        session, tls = self._client
        url = self.direct.url.rstrip("/") + path_of(namespace, name)
        try:
            async with session.get(url, params=params, ssl=tls,
                                         headers={"Authorization": authorization}) as response:
                body = await response.json(content_type=None)
                if response.status != 200:
                    message = body.get("message") if isinstance(body, dict) else None
                    raise ReadingsUnavailable(f"{response.status}: {message or response.reason}")
                if not isinstance(body, dict):
                    raise ReadingsUnavailable("the controller answered with something other than readings")
                return body
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            raise ReadingsUnavailable(f"the controller's readings are out of reach ({self.direct.url}): {err}") \
                from None

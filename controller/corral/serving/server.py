"""The HTTPS server: TLS, the caller's identity from its bearer token, and the audit log's read-only routes.

    GET /audit/v1/records[?namespace=NS][&device=D][&intent=I][&since=SECONDS]
        The records as JSON lines, oldest first. Needs the `audit` verb on corral.dev `devices`: in the
        namespace asked for (then only records about that namespace's objects), or cluster-wide.
    GET /audit/v1/log
        Every line of every file exactly as stored, for `corral audit verify`; needs `audit` cluster-wide.
    GET /audit/v1/checkpoint
        The newest checkpoint signed so far (the AuditCheckpoint object is the one to trust).
    GET /apis/readings.corral.dev/v1alpha1/namespaces/NS/devices/NAME
        Timestamped samples (see `readings`); needs `listen` on that Device.
    GET /apis/readings.corral.dev/v1alpha1/namespaces/NS/devices/NAME/history
        Samples over time from the history store (see `history`), with `--history-dir`; needs `listen` too.

`audit` is a verb of Corral's own on its `devices` resource (Kubernetes lets RBAC name any verb): a
ClusterRole with it lets a person read the whole log; a Role lets them read what concerns their
namespace. Reading the log is not `get` on Devices, so no existing role grants it by accident.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from aiohttp import web

from corral.audit.chain import AuditRecord
from corral.audit.log import log_files, read_records
from corral.audit.signer import last_checkpoint
from corral.kube.client import ApiError
from corral.serving import history as histories
from corral.serving import readings
from corral.serving.auth import Caller, Reviews, Unauthenticated
from corral.serving.frontproxy import FrontProxy, caller_of

log = logging.getLogger(__name__)

AUDIT_VERB = "audit"
CALLER = web.RequestKey("caller", Caller)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 503: "ServiceUnavailable"}


def _problem(status: int, message: str) -> web.Response:
    """A refusal as the API server words one (a Status), so kubectl shows it as its own: 'Error from server
    (Forbidden): ...'."""
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "reason": _REASONS.get(status, "InternalError"), "code": status, "message": message},
                             status=status)


class ReadServer:
    def __init__(self, reviews: Reviews, audit_dir: Path, port: int, cert_file: str, key_file: str,
                 host: str = "127.0.0.1", source: readings.ReadingsSource | None = None,
                 front_proxy: FrontProxy | None = None, history: histories.HistorySource | None = None) -> None:
        """front_proxy: the aggregation layer's requestheader CA and names; without it, a request that names
        its caller in X-Remote-* headers is refused. history: the store of samples over time, if one is kept."""
        self.reviews = reviews
        self.history = history
        self.audit_dir = audit_dir
        self.source = source
        self.port, self.host = port, host
        self.front_proxy = front_proxy
        # A server context that trusts no CA for client certificates but the front proxy's (not
        # create_default_context, which would trust the system's). Client certificates are optional
        # (CERT_OPTIONAL), so direct callers connect without one and bring a bearer token.
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.minimum_version = ssl.TLSVersion.TLSv1_2
        self.tls.load_cert_chain(cert_file, key_file)
        if front_proxy is not None:
            front_proxy.configure(self.tls)
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._authenticate])
        app.router.add_get("/audit/v1/records", self.records)
        app.router.add_get("/audit/v1/log", self.raw_log)
        app.router.add_get("/audit/v1/checkpoint", self.checkpoint)
        if self.source is not None:
            app.router.add_get(f"/apis/{readings.GROUP}", self.readings_group)
            app.router.add_get(readings.PREFIX, self.readings_discovery)
            app.router.add_get("/openapi/v2", self.readings_openapi)
            app.router.add_get(readings.PREFIX + "/namespaces/{namespace}/devices/{name}", self.device_readings)
            app.router.add_get(readings.PREFIX + "/namespaces/{namespace}/devices/{name}/history", self.device_history)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port, ssl_context=self.tls).start()
        log.info("serving the audit log on https://%s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        # Through the aggregation layer first: the front proxy's certificate and the caller it names. A request
        # naming a caller without that certificate is refused, whatever else it carries.
        try:
            vouched = caller_of(self.front_proxy, request)
        except Unauthenticated as err:
            return _problem(401, str(err))
        if vouched is not None:
            request[CALLER] = vouched
            return await handler(request)
        # API discovery answers anyone: the aggregator asks for it to call the APIService available.
        if request.path.rstrip("/") in (f"/apis/{readings.GROUP}", readings.PREFIX, "/openapi/v2"):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer ") or not header[7:].strip():
            return _problem(401, "send a Kubernetes bearer token (Authorization: Bearer ...): this server knows "
                                 "callers only as the API server does")
        try:
            request[CALLER] = await self.reviews.caller(header[7:].strip())
        except Unauthenticated as err:
            return _problem(401, str(err))
        except ApiError as err:
            return _problem(503, f"could not review the token with the API server: {err.status} {err.message}")
        return await handler(request)

    async def _allowed(self, request: web.Request, namespace: str | None) -> web.Response | None:
        where = f"in namespace {namespace}" if namespace else "cluster-wide (or pass ?namespace=NS)"
        return await self._refusal(request, AUDIT_VERB, namespace, None,
                                   f"read the audit log {where}: it needs the verb '{AUDIT_VERB}' on devices.corral.dev "
                                   "there")

    async def _refusal(self, request: web.Request, verb: str, namespace: str | None, device: str | None,
                       refused: str) -> web.Response | None:
        """None when the caller holds `verb` (SubjectAccessReview); else 403 '<caller> may not <refused>', or 503
        when the API server cannot be asked."""
        caller = request[CALLER]
        try:
            if await self.reviews.may(caller, verb, namespace, device):
                return None
        except ApiError as err:
            return _problem(503, f"could not ask the API server what {caller.username} may do: {err.message}")
        return _problem(403, f"{caller.username} may not {refused}")

    async def records(self, request: web.Request) -> web.StreamResponse:
        query = request.query
        namespace = query.get("namespace") or None
        denied = await self._allowed(request, namespace)
        if denied is not None:
            return denied
        try:
            since = datetime.now(UTC) - timedelta(seconds=float(query["since"])) if "since" in query else None
        except ValueError:
            return _problem(400, f"since={query['since']!r}: give seconds, e.g. since=3600")
        wanted = [w for w in (query.get("device"), query.get("intent")) if w]
        prefix = f"{namespace}/" if namespace else None

        def keep(record: AuditRecord) -> bool:
            if prefix is not None and not record.subject.startswith(prefix):
                return False
            if since is not None and record.at < since:
                return False
            return not wanted or any(record.subject == w or record.subject.endswith("/" + w) for w in wanted)

        lines = await asyncio.to_thread(
            lambda: [r.model_dump_json().encode() for r in read_records(self.audit_dir) if keep(r)])
        return web.Response(body=b"".join(line + b"\n" for line in lines), content_type="application/x-ndjson")

    async def raw_log(self, request: web.Request) -> web.StreamResponse:
        denied = await self._allowed(request, None)
        if denied is not None:
            return denied
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        for path in log_files(self.audit_dir):
            # A file is read whole: the last one may grow meanwhile, and a line is only ever added whole.
            data = await asyncio.to_thread(path.read_bytes)
            await response.write(data[:data.rfind(b"\n") + 1])
        await response.write_eof()
        return response

    async def readings_group(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(readings.group())

    async def readings_discovery(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(readings.discovery())

    async def readings_openapi(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(readings.openapi_v2())

    async def _may_listen(self, request: web.Request, namespace: str, name: str, what: str
                          ) -> web.StreamResponse | None:
        """The refusal of a caller without `listen` on the Device, or None. Checked before anything else is looked
        at, and the same whether or not the Device exists: a refusal must not confirm that it does."""
        return await self._refusal(request, readings.LISTEN_VERB, namespace, name,
                                   f"read {what} of device {namespace}/{name}: it needs the verb "
                                   f"'{readings.LISTEN_VERB}' on devices.corral.dev {name} in {namespace}")

    async def device_readings(self, request: web.Request) -> web.StreamResponse:
        assert self.source is not None
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        denied = await self._may_listen(request, namespace, name, "the samples")
        if denied is not None:
            return denied
        try:
            metrics, window_s = readings.parse_query(request.query)
        except readings.BadQuery as err:
            return _problem(400, str(err))
        document = readings.readings(self.source, namespace, name, metrics, window_s)
        if document is None:
            return _problem(404, f"no Device {name} in namespace {namespace}")
        return web.json_response(document)

    async def device_history(self, request: web.Request) -> web.StreamResponse:
        assert self.source is not None
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        denied = await self._may_listen(request, namespace, name, "the history")
        if denied is not None:
            return denied
        if self.history is None:
            return _problem(404, "this controller keeps no history of samples (corral run --history-dir)")
        try:
            asked = histories.parse(request.query)
        except readings.BadQuery as err:
            return _problem(400, str(err))
        view = self.source.view(namespace, name)
        if view is None:
            return _problem(404, f"no Device {name} in namespace {namespace}")
        try:
            document = await histories.history(self.history, namespace, name, view, asked)
        except readings.BadQuery as err:
            return _problem(400, str(err))
        return web.json_response(document)

    async def checkpoint(self, request: web.Request) -> web.StreamResponse:
        denied = await self._allowed(request, None)
        if denied is not None:
            return denied
        newest = await asyncio.to_thread(last_checkpoint, self.audit_dir)
        if newest is None:
            return _problem(404, "no checkpoint signed yet")
        return web.Response(text=newest.model_dump_json(), content_type="application/json")

"""The HTTPS server: TLS, the caller's identity from its bearer token, and the audit log's read-only routes.

    GET /audit/v1/records[?namespace=NS][&device=D][&intent=I][&since=SECONDS]
        The records as JSON lines, oldest first. Needs the `audit` verb on corral.dev `devices`: in the
        namespace asked for (then only records about that namespace's objects), or cluster-wide.
    GET /audit/v1/log
        Every line of every file exactly as stored, for `corral audit verify`; needs `audit` cluster-wide.
    GET /audit/v1/checkpoint
        The newest checkpoint signed so far (the AuditCheckpoint object is the one to trust).

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
from corral.client.asyncapi import ApiError
from corral.serving.auth import Caller, Reviews, Unauthenticated

log = logging.getLogger(__name__)

AUDIT_VERB = "audit"
CALLER = web.RequestKey("caller", Caller)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _problem(status: int, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "status": "Failure", "code": status, "message": message},
                             status=status)


class ReadServer:
    def __init__(self, reviews: Reviews, audit_dir: Path, port: int, cert_file: str, key_file: str,
                 host: str = "0.0.0.0") -> None:
        self.reviews = reviews
        self.audit_dir = audit_dir
        self.port, self.host = port, host
        self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.tls.load_cert_chain(cert_file, key_file)
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._authenticate])
        app.router.add_get("/audit/v1/records", self.records)
        app.router.add_get("/audit/v1/log", self.raw_log)
        app.router.add_get("/audit/v1/checkpoint", self.checkpoint)
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
        caller = request[CALLER]
        try:
            if await self.reviews.may(caller, AUDIT_VERB, namespace):
                return None
        except ApiError as err:
            return _problem(503, f"could not ask the API server what {caller.username} may do: {err.message}")
        where = f"in namespace {namespace}" if namespace else "cluster-wide (or pass ?namespace=NS)"
        return _problem(403, f"{caller.username} may not read the audit log {where}: it needs the verb "
                             f"'{AUDIT_VERB}' on devices.corral.dev there")

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

    async def checkpoint(self, request: web.Request) -> web.StreamResponse:
        denied = await self._allowed(request, None)
        if denied is not None:
            return denied
        newest = await asyncio.to_thread(last_checkpoint, self.audit_dir)
        if newest is None:
            return _problem(404, "no checkpoint signed yet")
        return web.Response(text=newest.model_dump_json(), content_type="application/json")

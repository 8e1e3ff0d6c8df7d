"""The approval page's HTTP server (aiohttp): static page, a JSON API for its script, sessions, decisions.

Routes:
  GET  /, /intents/NAMESPACE/NAME   the page (one HTML file; its script shows the list or one Intent)
  GET  /static/...                  app.js, style.css
  GET  /api/session                 who is signed in, and the CSRF token for the next POST
  POST /api/session                 sign in: `token` (form field or JSON), checked with a SelfSubjectReview
  POST /api/signout                 sign out: the server forgets the token
  GET  /api/intents                 what waits for the person (polled by the page every 2 s), and where agents
                                    are paused (`paused`: the page's banner)
  GET  /api/intents/NS/NAME         one Intent, waiting or decided (its outcome), and whether agents are paused there
  POST /api/intents/NS/NAME/decision  `decision` Approve|Deny, `reason`, `uid`: an Approval in the person's name
  GET  /healthz
  GET  /favicon.ico                 the page's icon

Every POST needs the session's CSRF token (header X-CSRF-Token or form field `csrf`; for sign-in, the one
GET /api/session handed out with a cookie) and must come from the page's own origin (guard.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, Final, Literal

import aiohttp
import kubernetes
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from corral.api.codes import PEOPLE_NAMESPACE
from corral.client.intents import decide_on_async
from corral.console.guard import CSRF_FIELD, CSRF_HEADER, SECURITY_HEADERS, cross_site_refusal, origin_of
from corral.console.people import Person, SignInRefused, clean_token, review
from corral.console.sessions import Session, SessionStore
from corral.console.waiting import intent_view, paused_notices, waiting_devices, waiting_for
from corral.console.words import who
from corral.contract.text import written_text
from corral.kube.client import ApiError

log = logging.getLogger(__name__)
# A call with the person's token that failed: refused by the API server, or it could not be reached.
API_FAILURES = (ApiError, aiohttp.ClientError, OSError, TimeoutError)

LOGIN_COOKIE: Final = "corral-signin"
NAMESPACE_PATTERN: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
NAME_PATTERN: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
MAX_REASON: Final = 512


def static_dir() -> Path:
    return Path(str(resources.files("corral.console") / "static"))


@dataclass
class Settings:
    base: kubernetes.client.Configuration  # the cluster address and CA only: anonymous()
    namespaces: list[str] | None  # None: every namespace the person may list Intents in
    origins: frozenset[str]  # the page's own origins (guard.own_origins)
    secure_cookies: bool  # served over https (or behind a proxy that is)
    public_url: str | None = None
    session_max_age_s: float = 8 * 3600.0
    session_idle_s: float = 3600.0
    people_namespace: str = PEOPLE_NAMESPACE  # its ServiceAccounts are people, named by their own name


@dataclass
class Console:
    settings: Settings
    store: SessionStore = field(init=False)
    people: dict[str, Person] = field(default_factory=dict)
    index_html: bytes = b""

    def __post_init__(self) -> None:
        self.store = SessionStore(self.settings.session_max_age_s, self.settings.session_idle_s)
        self.index_html = (static_dir() / "index.html").read_bytes()

    # Sessions ---------------------------------------------------------------------------------------------

    def cookie_name(self, request: web.Request) -> str:
        # `__Host-`: the browser keeps it only if Secure, for this host alone, path /.
        return "__Host-corral-session" if self._secure(request) else "corral-session"

    def _secure(self, request: web.Request) -> bool:
        return self.settings.secure_cookies or request.secure

    def session(self, request: web.Request) -> tuple[Session, Person] | None:
        found = self.store.get(request.cookies.get(self.cookie_name(request)))
        if found is None:
            return None
        person = self.people.get(found.id)
        return (found, person) if person is not None else None

    async def end(self, session_id: str | None) -> None:
        self.store.end(session_id)
        person = self.people.pop(session_id or "", None)
        if person is not None:
            await person.close()

    async def expire(self) -> None:
        for ended in self.store.expire():
            person = self.people.pop(ended.id, None)
            if person is not None:
                await person.close()

    async def close(self) -> None:
        for person in list(self.people.values()):
            await person.close()
        self.people.clear()

    def served(self, namespace: str) -> bool:
        return self.settings.namespaces is None or namespace in self.settings.namespaces

    # Handlers ---------------------------------------------------------------------------------------------

    async def page(self, request: web.Request) -> web.StreamResponse:
        if "namespace" in request.match_info and not _valid(request):
            return _error(request, 404, "No such Intent page: /intents/NAMESPACE/NAME takes Kubernetes names.")
        return web.Response(body=self.index_html, content_type="text/html", charset="utf-8",
                            headers={"Cache-Control": "no-store"})

    async def healthz(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    async def favicon(self, request: web.Request) -> web.StreamResponse:
        # Browsers ask for /favicon.ico whatever the page links; a 404 there fills every log with noise.
        return web.FileResponse(static_dir() / "favicon.ico", headers={"Cache-Control": "max-age=86400"})

    async def get_session(self, request: web.Request) -> web.StreamResponse:
        current = self.session(request)
        if current is not None:
            return _json(self._signed_in(current[0]))
        # Not signed in: a sign-in CSRF token, in a cookie and in the answer (double submit).
        token = request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(32)
        response = _json({"signedIn": False, "csrf": token})
        response.set_cookie(LOGIN_COOKIE, token, httponly=True, samesite="Strict", secure=self._secure(request),
                            path="/", max_age=3600)
        return response

    async def sign_in(self, request: web.Request) -> web.StreamResponse:
        form = await _form(request)
        expected = request.cookies.get(LOGIN_COOKIE)
        if not expected or not _same(expected, _csrf(request, form)):
            return _error(request, 403, "Refused: the sign-in form has expired or did not come from this page. "
                                        "Reload the page and sign in again.")
        try:
            token = clean_token(str(form.get("token") or ""))
            identity = await review(self.settings.base, token)
        except SignInRefused as refused:
            return _error(request, 401, str(refused))
        previous = request.cookies.get(self.cookie_name(request))
        if previous:
            await self.end(previous)
        session, pushed_out = self.store.create(token, identity.username, identity.groups)
        for ended in pushed_out:
            person = self.people.pop(ended.id, None)
            if person is not None:
                await person.close()
        self.people[session.id] = Person(self.settings.base, token, identity)
        log.info("signed in: %s", identity.username)
        response = _json(self._signed_in(session))
        response.set_cookie(self.cookie_name(request), session.id, httponly=True, samesite="Strict",
                            secure=self._secure(request), path="/", max_age=int(self.settings.session_max_age_s))
        response.del_cookie(LOGIN_COOKIE, path="/")
        return response

    async def sign_out(self, request: web.Request) -> web.StreamResponse:
        current = self.session(request)
        if current is not None:
            form = await _form(request)
            if not current[0].csrf_matches(_csrf(request, form)):
                return _error(request, 403, "Refused: this request carries no valid CSRF token of your session.")
            log.info("signed out: %s", current[0].username)
            await self.end(current[0].id)
        response = _json({"signedIn": False})
        response.del_cookie(self.cookie_name(request), path="/")
        return response

    async def list_waiting(self, request: web.Request) -> web.StreamResponse:
        current = self._signed_in_or_401(request)
        session, person = current
        try:
            intents, problems = await person.intents(self.settings.namespaces)
            keys = waiting_devices(intents)
            approvable = await person.approvable(keys)
            devices = await person.devices(approvable)
            contracts = await person.contracts(devices)
            switches = await person.switches(self.settings.namespaces)
        except API_FAILURES as err:
            return await self._failed(request, session, err)
        views = waiting_for(intents, devices, approvable, datetime.now(UTC), contracts, self.settings.people_namespace)
        return _json({"items": [v.as_json() for v in views], "problems": problems,
                      "namespaces": self.settings.namespaces, "username": session.username,
                      "paused": paused_notices(switches, self.settings.namespaces)})

    async def show_intent(self, request: web.Request) -> web.StreamResponse:
        session, person = self._signed_in_or_401(request)
        namespace, name = self._target(request)
        try:
            intent = await person.intent(namespace, name)
            key = (namespace, str(intent["spec"].get("device") or ""))
            may = await person.may_approve(key)
            device = await person.device(key)
            contract = await person.contract(device)
            switches = await person.switches([namespace])
        except API_FAILURES as err:
            return await self._failed(request, session, err, (namespace, name))
        view = intent_view(intent, device, may, datetime.now(UTC), contract, self.settings.people_namespace)
        return _json({"intent": view.as_json(),
                      "username": session.username, "paused": paused_notices(switches, [namespace])})

    async def decide(self, request: web.Request) -> web.StreamResponse:
        session, person = self._signed_in_or_401(request)
        namespace, name = self._target(request)
        form = await _form(request)
        if not session.csrf_matches(_csrf(request, form)):
            return _error(request, 403, "Refused: this request carries no valid CSRF token of your session. "
                                        "Reload the approval page and decide there.")
        decision = str(form.get("decision") or "")
        if decision not in ("Approve", "Deny"):
            return _error(request, 400, "decision must be Approve or Deny.")
        verdict: Literal["Approve", "Deny"] = "Approve" if decision == "Approve" else "Deny"
        # One line, nothing invisible: the requester (maybe an agent) reads it in its refusal.
        reason = written_text(str(form.get("reason") or ""), MAX_REASON)
        uid = str(form.get("uid") or "") or None
        try:
            approval = await decide_on_async(person.api, namespace, name, verdict, reason, session.username,
                                             session.groups, expected_uid=uid)
        except ValueError as err:
            return _error(request, 409, str(err))
        except API_FAILURES as err:
            return await self._failed(request, session, err, (namespace, name))
        done = "approved" if verdict == "Approve" else "denied"
        log.info("%s %s %s/%s (Approval %s)", session.username, done, namespace, name, approval["metadata"]["name"])
        return _json({"approval": approval["metadata"]["name"],
                      "message": f"You {done} {name}; the controller decides what happens next."})

    # Helpers ----------------------------------------------------------------------------------------------

    def _signed_in(self, session: Session) -> dict[str, Any]:
        # `name`: what the header shows ("alice", not system:serviceaccount:corral-people:alice).
        return {"signedIn": True, "username": session.username,
                "name": who(session.username, self.settings.people_namespace).name,
                "groups": list(session.groups), "csrf": session.csrf}

    def _signed_in_or_401(self, request: web.Request) -> tuple[Session, Person]:
        current = self.session(request)
        if current is None:
            raise _http_error(request, 401, "You are not signed in (or your session ended).")
        return current

    def _target(self, request: web.Request) -> tuple[str, str]:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if not _valid(request):
            raise _http_error(request, 404, "Intents are named by Kubernetes names: /intents/NAMESPACE/NAME.")
        if not self.served(namespace):
            raise _http_error(request, 404, f"This console serves the namespaces "
                                                         f"{', '.join(self.settings.namespaces or [])}, not {namespace}.")
        return namespace, name

    async def _failed(self, request: web.Request, session: Session, err: Exception,
                      intent: tuple[str, str] | None = None) -> web.StreamResponse:
        """What the person is told when the API server refused a call made with their token, or was not reached."""
        if not isinstance(err, ApiError):
            return _error(request, 502, f"The console cannot reach the API server: {err}")
        if err.status == 404 and intent is not None:
            return _error(request, 404, f"There is no Intent {intent[1]} in namespace {intent[0]} (any more).")
        if err.status == 401:
            await self.end(session.id)
            return _error(request, 401, "The API server no longer accepts your token (it expired or was revoked): "
                                        "sign in again with a new one.")
        return _error(request, err.status if 400 <= err.status < 500 else 502,
                      f"The API server refused ({err.status}): {err.message}")


def _valid(request: web.Request) -> bool:
    return bool(NAMESPACE_PATTERN.fullmatch(request.match_info.get("namespace", ""))
                and NAME_PATTERN.fullmatch(request.match_info.get("name", "")))


def _same(a: str, b: str | None) -> bool:
    return b is not None and secrets.compare_digest(a.encode(), b.encode())


def _csrf(request: web.Request, form: dict[str, Any]) -> str | None:
    offered = request.headers.get(CSRF_HEADER) or form.get(CSRF_FIELD)
    return str(offered) if offered is not None else None


async def _form(request: web.Request) -> dict[str, Any]:
    """A POST body: JSON (the page's script) or a form (a browser without it)."""
    if request.content_type == "application/json":
        try:
            body = await request.json()
        except ValueError:
            raise _http_error(request, 400, "The request body is not JSON.") from None
        if not isinstance(body, dict):
            raise _http_error(request, 400, "The request body must be a JSON object.")
        return body
    return {k: v for k, v in (await request.post()).items() if isinstance(v, str)}


def _json(document: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(document), status=status, content_type="application/json",
                        headers={"Cache-Control": "no-store"})


def _wants_json(request: web.Request) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def _error(request: web.Request, status: int, message: str) -> web.Response:
    if _wants_json(request):
        return _json({"error": message}, status)
    return web.Response(text=message + "\n", status=status, content_type="text/plain", charset="utf-8",
                        headers={"Cache-Control": "no-store"})


class _Reply(Exception):
    """Raised by a handler's helpers: answer with this response (an error) instead."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.text)
        self.response = response


def _http_error(request: web.Request, status: int, message: str) -> _Reply:
    return _Reply(_error(request, status, message))


def request_origin(request: web.Request) -> str | None:
    return origin_of(f"{request.scheme}://{request.host}") if request.host else None


def guard(console: Console) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        refusal = cross_site_refusal(request.method, request.headers, request_origin(request),
                                     console.settings.origins, api=request.path.startswith("/api/"))
        if refusal is not None:
            log.warning("refused %s %s: %s", request.method, request.path, refusal)
            response: web.StreamResponse = _error(request, 403, refusal)
        else:
            try:
                response = await handler(request)
            except _Reply as reply:
                response = reply.response
            except web.HTTPException as err:  # aiohttp's own: no such route, method, static file
                response = web.Response(status=err.status, text=f"{err.status} {err.reason}\n",
                                        content_type="text/plain")
        for header, value in SECURITY_HEADERS.items():
            response.headers[header] = value
        return response

    return middleware


async def _expire_sessions(console: Console) -> None:
    while True:
        await asyncio.sleep(30)
        await console.expire()


def build_app(settings: Settings) -> web.Application:
    console = Console(settings)
    app = web.Application(middlewares=[guard(console)], client_max_size=64 * 1024)
    app.router.add_get("/", console.page)
    app.router.add_get("/intents/{namespace}/{name}", console.page)
    app.router.add_get("/healthz", console.healthz)
    app.router.add_get("/favicon.ico", console.favicon)
    app.router.add_get("/api/session", console.get_session)
    app.router.add_post("/api/session", console.sign_in)
    app.router.add_post("/api/signout", console.sign_out)
    app.router.add_get("/api/intents", console.list_waiting)
    app.router.add_get("/api/intents/{namespace}/{name}", console.show_intent)
    app.router.add_post("/api/intents/{namespace}/{name}/decision", console.decide)
    app.router.add_static("/static/", static_dir(), show_index=False, follow_symlinks=False)

    async def lifetime(_app: web.Application) -> Any:
        expiring = asyncio.create_task(_expire_sessions(console))
        yield
        expiring.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await expiring
        await console.close()

    app.cleanup_ctx.append(lifetime)
    return app


def serve(settings: Settings, host: str, port: int) -> None:
    web.run_app(build_app(settings), host=host, port=port, print=None, handle_signals=True, shutdown_timeout=5)


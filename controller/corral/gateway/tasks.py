"""The MCP tasks extension (SEP-2663, `io.modelcontextprotocol/tasks`) for iot.control calls that wait for a human.

A client that declares the extension in a request's capabilities (protocol 2026-07-28; the extension is not
defined on the handshake-era protocols) gets, for an `iot.control` whose Intent waits for a person's approval,
a task (`resultType: "task"`) instead of `AWAITING_APPROVAL`. The task *is* the Intent: its id is the Intent's
`namespace/name`, and the gateway keeps no task state of its own: `tasks/get` reads the Intent and maps its
status (pure functions below), so a task survives a gateway restart and reads the same on every replica.

Intent names can be guessed (they are request ids), so a task id is no secret: every `tasks/*` call reads the
Intent with the caller's own credentials (RBAC decides), and a task belongs to its requester alone; anyone else
is answered exactly as for a task that does not exist. `tasks/cancel` withdraws the Intent by setting the
cancel annotation as the caller (an admission policy lets only the requester do that); the controller ends it
`CANCELLED` with nothing executed. There is no `tasks/list` and no `tasks/result` (SEP-2663 has neither).

Where the client supports URL-mode elicitation and `corral mcp --console-url` is set, a waiting task is
`input_required` with one URL-mode `elicitation/create` offering the approval page to the person at the client.
An answer to it (`tasks/update`), accept or decline, approves nothing: only an Approval made by a person counts.
Form-mode elicitation is never used.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal
from urllib.parse import quote, urlsplit

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from corral.api.codes import CANCEL_ANNOTATION, FINAL_PHASES, GROUP, VERSION, Phase
from corral.api.intent import Intent
from corral.audit.log import AuditLog
from corral.contract.values import shown
from corral.gateway.tools.intents import parts
from corral.gateway.view import CallerView
from corral.kube.client import ApiError, path_of
from corral.kube.typed import Malformed, parse

log = logging.getLogger(__name__)

EXTENSION: Final = "io.modelcontextprotocol/tasks"
POLL_INTERVAL_MS: Final = 1000  # a person decides in seconds to minutes; the controller acts within a second
# The one input request a task ever carries; a key is never reused for another request in a task's lifetime.
APPROVAL_PAGE_KEY: Final = "corral.approval-page"
CANCEL_REASON: Final = "Withdrawn by the requester (MCP tasks/cancel)."
MAX_ANSWERED = 10_000  # approval-page answers remembered (Intent UIDs); beyond, the oldest is forgotten

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
Ctx = ServerRequestContext[Any, Any]


# ---- the pure mapping: an Intent as a task ---------------------------------------------------------------------

def declared(protocol_version: str, capabilities: types.ClientCapabilities | None) -> bool:
    """Whether a request's client declared the extension: per request, and only on a protocol that defines it."""
    extensions = capabilities.extensions if capabilities is not None else None
    return protocol_version in MODERN_PROTOCOL_VERSIONS and bool(extensions) and EXTENSION in (extensions or {})


def url_elicitation(capabilities: types.ClientCapabilities | None) -> bool:
    """Whether the client supports URL-mode elicitation (an empty `elicitation` means form mode only)."""
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and elicitation.url is not None


def task_id(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def parse_task_id(value: Any) -> tuple[str | None, str] | None:
    """(namespace, name) of a task id; namespace None for a bare name; None for what cannot be an Intent's name."""
    if not isinstance(value, str) or not value or len(value) > 317 or value.count("/") > 1:
        return None
    namespace, _, name = value.rpartition("/")
    if not name or (value.count("/") == 1 and not namespace):
        return None
    return namespace or None, name


def approval_page(console_url: str, namespace: str, name: str) -> str:
    """Where the approval page (`corral console`) shows one Intent."""
    return f"{console_url.rstrip('/')}/intents/{quote(namespace, safe='')}/{quote(name, safe='')}"


def valid_console_url(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and not parts.query and not parts.fragment


def status_of(intent: dict[str, Any]) -> TaskStatus:
    """The task status of an Intent, before any input request is offered: an Intent that has not ended works
    (Pending, AwaitingApproval, Executing); a final one is completed (its code is in the tool result, denials
    included: a tool result, never a JSON-RPC error), or cancelled when the requester withdrew it."""
    _, _, status = parts(intent)
    if status.get("phase") in FINAL_PHASES:
        return "cancelled" if status.get("code") == "CANCELLED" else "completed"
    return "working"


def _updated_at(intent: dict[str, Any]) -> str:
    meta, _, status = parts(intent)
    times = [str(c["lastTransitionTime"]) for c in status.get("conditions") or [] if c.get("lastTransitionTime")]
    if status.get("decidedAt"):
        times.append(str(status["decidedAt"]))
    created = str(meta.get("creationTimestamp") or "")
    return max([created, *times], key=_instant)


def _instant(value: str) -> datetime:
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def status_message(intent: dict[str, Any]) -> str:
    meta, spec, status = parts(intent)
    name, namespace = meta.get("name", ""), meta.get("namespace", "")
    phase = status.get("phase")
    if phase == "AwaitingApproval":
        until = status.get("approvalExpiresAt")
        return (f"Waiting for a person to approve Intent {namespace}/{name} (corral approve {name} -n {namespace}, or "
                f"the approval page){f'; the request expires at {until}' if until else ''}. Nothing runs before.")
    if phase == "Executing":
        return f"Approved; executing on device {spec.get('device', '')}."
    if phase in FINAL_PHASES:
        return f"{status.get('code') or phase}: {status.get('message') or ''}".strip()
    return "Waiting for the controller to decide."


def task(intent: dict[str, Any]) -> dict[str, Any]:
    """The fields every task view of an Intent carries (SEP-2663 `Task`)."""
    meta, _, _ = parts(intent)
    return {"taskId": task_id(str(meta.get("namespace", "")), str(meta.get("name", ""))),
            "status": status_of(intent), "statusMessage": status_message(intent),
            "createdAt": str(meta.get("creationTimestamp") or ""), "lastUpdatedAt": _updated_at(intent),
            # The gateway discards nothing: the task lives as long as its Intent (the controller's --intent-retention).
            "ttlMs": None, "pollIntervalMs": POLL_INTERVAL_MS}


def created(intent: dict[str, Any]) -> dict[str, Any]:
    """The `CreateTaskResult` answering a tools/call whose Intent waits for a person: the seed state, working."""
    return {"resultType": "task", **task(intent), "status": "working"}


def approval_request(intent: dict[str, Any], url: str) -> dict[str, Any]:
    """The URL-mode elicitation that offers the approval page: the person decides there, signed in as themselves."""
    meta, spec, _ = parts(intent)
    value = (spec.get("params") or {}).get("value")
    message = (f"An agent asks to {spec.get('action', 'act')} {spec.get('actuator', '')} = {shown(value)} on device "
               f"{spec.get('device', '')} (Intent {meta.get('namespace')}/{meta.get('name')}); a person must approve "
               "it. Open the approval page to review it and approve or deny it as yourself. Answering here approves "
               "nothing.")
    return {"method": "elicitation/create", "params": {"mode": "url", "url": url, "message": message}}


def detailed(intent: dict[str, Any], result: dict[str, Any], approval_url: str | None = None) -> dict[str, Any]:
    """What `tasks/get` answers (SEP-2663 `DetailedTask`): `result` (the CallToolResult iot.control would give now)
    once completed; `approval_url`: offer it (input_required) while the Intent awaits approval."""
    view = task(intent)
    if view["status"] == "completed":
        return {**view, "result": result}
    if approval_url is not None and parts(intent)[2].get("phase") == "AwaitingApproval":
        return {**view, "status": "input_required",
                "inputRequests": {APPROVAL_PAGE_KEY: approval_request(intent, approval_url)}}
    return view


# ---- the methods ------------------------------------------------------------------------------------------------

class TaskParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class UpdateTaskParams(TaskParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


ViewOf = Callable[[Ctx], Awaitable[CallerView]]
ResultOf = Callable[[dict[str, Any]], dict[str, Any]]  # Intent -> the CallToolResult (wire form) it stands for
Refused = Callable[[CallerView, str, Any, str, str], None]  # view, method, arguments, code, message


def missing_extension() -> MCPError:
    return MCPError(types.MISSING_REQUIRED_CLIENT_CAPABILITY, "Missing required client capability",
                    {"requiredCapabilities": {"extensions": {EXTENSION: {}}}})


def _not_found(value: Any) -> MCPError:
    # One answer for a task that does not exist, one the caller may not read, and one of another requester.
    return MCPError(types.INVALID_PARAMS, f"Failed to retrieve task: Task not found: {value!r}")


class Tasks:
    """`tasks/get`, `tasks/update` and `tasks/cancel`, wired into the SDK's low-level server by hand (the SDK has
    no tasks runtime), and the task a waiting iot.control answers with."""

    def __init__(self, view_of: ViewOf, result_of: ResultOf, refused: Refused, *, audit: AuditLog | None = None,
                 console_url: str | None = None) -> None:
        self.view_of = view_of
        self.result_of = result_of
        self.refused = refused
        self.audit = audit
        self.console_url = console_url
        self._answered: OrderedDict[str, str] = OrderedDict()  # Intent UID -> the answer to its approval page

    def register(self, server: Server[Any]) -> None:
        server.add_request_handler("tasks/get", TaskParams, self.get)
        server.add_request_handler("tasks/update", UpdateTaskParams, self.update)
        server.add_request_handler("tasks/cancel", TaskParams, self.cancel)
        server.extensions[EXTENSION] = {}  # advertised in server/discover

    @staticmethod
    def wanted(ctx: Ctx) -> bool:
        return declared(ctx.protocol_version, ctx.session.client_capabilities)

    async def created_for(self, view: CallerView, namespace: str, name: str) -> dict[str, Any] | None:
        """The task for an Intent the caller just made (or repeated) that waits for a person; read back with the
        caller's credentials first, so that a tasks/get for it resolves (SEP-2663: durably created)."""
        found = await self._read(view, namespace, name)
        return created(found.body) if found is not None and found.phase == "AwaitingApproval" else None

    async def get(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        _, found = await self._task(ctx, "tasks/get", params.task_id)
        offer = None
        if self.console_url and url_elicitation(ctx.session.client_capabilities) and found.uid not in self._answered:
            offer = approval_page(self.console_url, found.namespace, found.name)
        return detailed(found.body, self.result_of(found.body), offer)

    async def update(self, ctx: Ctx, params: UpdateTaskParams) -> dict[str, Any]:
        view, found = await self._task(ctx, "tasks/update", params.task_id)
        answer = params.input_responses.get(APPROVAL_PAGE_KEY)
        if isinstance(answer, dict) and found.phase == "AwaitingApproval":
            # Whatever the answer (accept: the person opens the page; decline, cancel), it approves nothing and
            # withdraws nothing; the page is just not offered again. Other keys were never issued: ignored.
            self._remember(found.uid, str(answer.get("action")))
            log.info("%s answered the approval page of %s: %s (approves nothing)", view.username, params.task_id,
                     answer.get("action"))
        return {}

    async def cancel(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        view, found = await self._task(ctx, "tasks/cancel", params.task_id)
        for _ in range(5):
            _refuse_to_cancel(found)
            if CANCEL_ANNOTATION in (found.intent.metadata.annotations or {}):
                return {}  # withdrawn already: the controller is ending it
            # Conditional on the version read: cancel only what was seen not to have started.
            body = {"metadata": {"resourceVersion": found.intent.metadata.resource_version,
                                 "annotations": {CANCEL_ANNOTATION: CANCEL_REASON}}}
            try:
                await view.follower.api.request(
                    "PATCH", path_of(GROUP, VERSION, "intents", found.namespace, found.name), body=body,
                    content_type="application/merge-patch+json")
            except ApiError as err:
                if err.status == 409:
                    again = await self._read(view, found.namespace, found.name)
                    if again is None:
                        raise _not_found(params.task_id) from None
                    found = again
                    continue
                if err.status == 404:
                    raise _not_found(params.task_id) from None
                raise MCPError(types.INVALID_PARAMS, f"The Kubernetes API refused the cancel: {err.status} "
                               f"{err.reason}: {err.message} (cancelling needs patch on intents)",
                               {"code": "DENY_SCOPE" if err.status in (401, 403) else "FAILED"}) from None
            if self.audit is not None:
                self.audit.note("gateway.task_cancelled", view.username or "anonymous",
                                {"task": task_id(found.namespace, found.name), "reason": CANCEL_REASON},
                                uid=found.uid)
            return {}
        raise MCPError(types.INTERNAL_ERROR, f"Task {params.task_id} kept changing; try tasks/cancel again.")

    async def _task(self, ctx: Ctx, method: str, value: str) -> tuple[CallerView, Found]:
        """The caller's view and the Intent a task id names, read as the caller, if it is the caller's own."""
        if not self.wanted(ctx):
            raise missing_extension()
        view = await self.view_of(ctx)
        parsed = parse_task_id(value)
        if parsed is None:
            raise _not_found(value)
        namespace, name = parsed
        for ns in [namespace] if namespace is not None else view.namespaces:
            if ns not in view.namespaces:
                break
            if not view.access.may(ns, "get", "intents", name=name):
                self.refused(view, method, {"taskId": value}, "DENY_SCOPE", f"may not get Intent {ns}/{name}")
                continue
            try:
                found = await self._read(view, ns, name)
            except ApiError as err:
                if err.status not in (401, 403):
                    raise
                self.refused(view, method, {"taskId": value}, "DENY_SCOPE", f"may not get Intent {ns}/{name}")
                continue
            if found is None:
                continue
            requester = found.intent.spec.requester
            if not view.username or requester != view.username:
                self.refused(view, method, {"taskId": value}, "DENY_SCOPE",
                             f"the task {ns}/{name} is not the caller's: its requester is {requester}")
                continue
            return view, found
        raise _not_found(value)

    @staticmethod
    async def _read(view: CallerView, namespace: str, name: str) -> Found | None:
        try:
            body = await view.follower.get(namespace, name)
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        try:
            return Found(body, parse(Intent, body))
        except Malformed as err:  # the API server validated it: not seen in practice, and never a crash
            log.warning("%s; it is not a task", err)
            return None

    def _remember(self, uid: str, action: str) -> None:
        self._answered[uid] = action
        self._answered.move_to_end(uid)
        while len(self._answered) > MAX_ANSWERED:
            self._answered.popitem(last=False)


@dataclass(frozen=True)
class Found:
    """An Intent read as the caller: as the API server sent it (what the task's texts and result are made from)
    and as its model (what the methods decide on)."""

    body: dict[str, Any]
    intent: Intent

    @property
    def namespace(self) -> str:
        return self.intent.metadata.namespace or ""

    @property
    def name(self) -> str:
        return self.intent.metadata.name or ""

    @property
    def uid(self) -> str:
        return self.intent.metadata.uid or ""

    @property
    def phase(self) -> Phase | None:
        return self.intent.status.phase if self.intent.status is not None else None


def _refuse_to_cancel(found: Found) -> None:
    """What cannot be withdrawn any more: an Intent that has ended, or one executing on the device already."""
    status, phase = found.intent.status, found.phase
    if phase in FINAL_PHASES:
        code = status.code if status is not None else None
        raise MCPError(types.INVALID_PARAMS, f"Task {task_id(found.namespace, found.name)} has ended "
                       f"({status_of(found.body)}, {code}): there is nothing to cancel.",
                       {"status": status_of(found.body), "code": code})
    if phase == "Executing":
        raise MCPError(types.INVALID_PARAMS, f"Task {task_id(found.namespace, found.name)} is executing "
                       "on the device already and can no longer be withdrawn; tasks/get gives its outcome.",
                       {"status": "working", "phase": phase})

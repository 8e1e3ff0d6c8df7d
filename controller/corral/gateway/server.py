"""The MCP server: transport-facing handlers and the session, answered from the caller's own view.

Built on the SDK's low-level `Server`, so every tool schema is exactly what the tool objects (`tools/`, listed
per caller by `toolset`) say. Handlers resolve the caller first (stdio: the kubeconfig user; HTTP: the
request's bearer token), then work only through that caller's `CallerView` and credentials. What a tool does is
the tool's; what a resource or the prompt answers is `resources`' and `prompts`'. This module keeps what is the
session's: who the caller is, who holds a lease, pages of the tool list, refusals on record, and the tasks
extension's answer for a call that waits for a person.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
from collections.abc import Callable
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from corral import __version__
from corral.audit.log import AuditLog
from corral.gateway import prompts, readings, resources, tasks, toolset
from corral.gateway.identity import Caller
from corral.gateway.prompts import DATA_LABEL, DIAGNOSE_INSTRUCTIONS, data_block
from corral.gateway.tools.base import Call, RateLimit, Services
from corral.gateway.tools.intents import task_result, waits_for_a_person
from corral.gateway.tools.lease import release_held
from corral.gateway.unseen import nothing_visible_note
from corral.gateway.view import CallerView, Views
from corral.kube.client import ApiError
from corral.obs import metrics

__all__ = ["DATA_LABEL", "DIAGNOSE_INSTRUCTIONS", "Gateway", "RateLimit", "data_block", "instructions",
           "session_holder"]

log = logging.getLogger(__name__)

TOOLS_PER_PAGE = 100
INSTRUCTIONS = (
    "Corral lets you read and operate physical devices. Start with iot.list_devices or iot.query, then ask for a "
    "target state with iot.control; you only see devices and tools your Kubernetes permissions allow. High-risk "
    "actions wait for a human (AWAITING_APPROVAL): report that and check back with iot.intent_status."
)
# Over HTTP the instructions are the same for every caller (the SDK answers initialize before the caller's view
# exists): they say what an empty tool list means instead of assuming tools the caller may not have.
EMPTY_TOOLS_HINT = (
    "If your tool list is empty, your Kubernetes identity can see no device here: tell the user, who must ask "
    "their operator for a RoleBinding to the ClusterRole corral-agent-operator (or corral-agent-reader) in the "
    "namespace, e.g. kubectl create rolebinding corral-agent-NAME --clusterrole=corral-agent-operator "
    "--serviceaccount=NAMESPACE:NAME -n NAMESPACE."
)
NOTHING_VISIBLE = ("Corral lets you read and operate physical devices, but you can see none here, so you have no "
                   "tools yet; do not try to call any.")
MAX_AUDITED_ARGUMENTS = 2048  # characters of a refused call's arguments kept in the audit log

CallerOf = Callable[[ServerRequestContext[Any, Any]], Caller]

# Who holds a lease is the caller and a holder id: the client's own (`holder`), else the session's. A stdio
# gateway serves one session for its whole life; over HTTP the handshake era has Mcp-Session-Id, 2026-07-28 none.
STDIO_HOLDER = f"stdio-{secrets.token_hex(6)}"


def holder_of(ctx: ServerRequestContext[Any, Any], given: Any) -> str | None:
    if isinstance(given, str) and given:
        return given
    request = ctx.request
    if request is None:
        return STDIO_HOLDER
    session = getattr(request, "headers", {}).get("mcp-session-id")
    return session_holder(session) if session else None


def session_holder(session_id: str) -> str:
    """The holder id of a handshake-era HTTP session's leases."""
    return f"mcp-{re.sub(r'[^A-Za-z0-9._:-]', '', session_id)[:120]}"


def declared_headers(tool: str) -> None:
    """The input schema the SDK checks a 2026-07-28 tools/call's `Mcp-Param-*` headers against: none, because no
    Corral tool declares one (`x-mcp-header`; tests/integration/test_gateway_transport.py proves it). Without this
    lookup the SDK finds the schema by running the whole tools/list handler, and serialising the caller's catalog,
    before every tools/call that has arguments (about 2.7 ms of the gateway's CPU per call)."""
    return None


class GatewayServer(Server[Any]):
    """Advertises list-changed notices on the handshake era too (the HTTP session manager asks without options)."""

    def create_initialization_options(self, notification_options: NotificationOptions | None = None,
                                      experimental_capabilities: dict[str, dict[str, Any]] | None = None,
                                      extensions: dict[str, dict[str, Any]] | None = None) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True, resources_changed=True),
            experimental_capabilities, extensions)


def instructions(namespaces: list[str], nothing_visible: str | None = None, paused: str | None = None,
                 caller_known: bool = True) -> str:
    """What the server tells every client when it connects: how to begin, where it looks, and (stdio) a warning
    when the caller can see nothing at all (then no tool to start with: it has none), or when agents are paused.
    caller_known=False (HTTP: one text for every caller): what an empty tool list means, too."""
    where = f"Devices are served from namespace(s) {', '.join(namespaces)} (corral mcp -n NAMESPACE)."
    begin = NOTHING_VISIBLE if nothing_visible else INSTRUCTIONS
    hint = None if caller_known else EMPTY_TOOLS_HINT
    return " ".join(part for part in (begin, where, hint, nothing_visible, paused) if part)


class Gateway:
    def __init__(self, views: Views, caller_of: CallerOf, *, wait_s: float = 10.0,
                 rate_limit: RateLimit | None = None, instructions: str = INSTRUCTIONS,
                 audit: AuditLog | None = None, readings_direct: readings.Direct | None = None,
                 console_url: str | None = None) -> None:
        self.views = views
        # Readings direct None: through the API server's APIService.
        self.services = Services(wait_s, rate_limit or RateLimit(0, 1), readings.Readings(readings_direct))
        self.audit = audit  # the gateway's own chained log: what it refused, and why
        self.caller_of = caller_of
        self.server = GatewayServer(
            "corral", version=__version__, title="Corral", instructions=instructions,
            get_tool_input_schema=declared_headers,
            on_list_tools=self.list_tools,
            on_list_resources=self.list_resources, on_list_resource_templates=self.list_resource_templates,
            on_read_resource=self.read_resource, on_subscribe_resource=self.subscribe,
            on_unsubscribe_resource=self.unsubscribe, on_subscriptions_listen=self.listen,
            on_list_prompts=self.list_prompts, on_get_prompt=self.get_prompt, on_completion=self.complete,
        )
        # Registered by hand: for a client with the tasks extension, a call that waits for a person answers
        # with a task (a CreateTaskResult), which the constructor's typed on_call_tool cannot return.
        self.server.add_request_handler("tools/call", types.CallToolRequestParams, self.call_tool)
        self.tasks = tasks.Tasks(self.view, task_result, self._refused, audit=audit, console_url=console_url)
        self.tasks.register(self.server)

    @property
    def readings(self) -> readings.Readings:
        return self.services.readings

    async def view(self, ctx: ServerRequestContext[Any, Any]) -> CallerView:
        view = await self.views.of(self.caller_of(ctx))
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            view.audience.join(ctx.session)
        return view

    async def release_held(self, holder_of_session: str | None = None) -> None:
        """A session ends: the leases it took through this gateway are given back."""
        await release_held(self.services, holder_of_session)

    # ---- tools ------------------------------------------------------------------------------------------------

    async def list_tools(self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        with metrics.TOOLS_LIST_SECONDS.time():
            return await self._list_tools(ctx, params)

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
                          ) -> types.ListToolsResult:
        view = await self.view(ctx)
        tools = view.memo.get("tools")
        if tools is None:
            tools = view.memo["tools"] = [types.Tool.model_validate(t)
                                          for t in toolset.catalog(view).definitions()]
        # Pages keep every response small however many device tools there are; a cursor is an offset.
        cursor = params.cursor if params is not None else None
        start = int(cursor) if cursor and cursor.isdigit() else 0
        if cursor and not cursor.isdigit():
            raise MCPError(types.INVALID_PARAMS, f"Invalid cursor {cursor!r}: pass the nextCursor of the last page")
        end = start + TOOLS_PER_PAGE
        return types.ListToolsResult(tools=tools[start:end], next_cursor=str(end) if end < len(tools) else None)

    async def call_tool(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
                        ) -> types.CallToolResult | dict[str, Any]:
        view = await self.view(ctx)
        name = params.name
        catalog = toolset.catalog(view)
        tool = catalog.find(name)
        if tool is None:
            # A tool the caller was not shown does not exist for it: a protocol error, as MCP says, with the code.
            metrics.TOOL_CALLS.labels(tool="unknown", outcome="unknown_tool").inc()
            message = f"Unknown tool: {name}"
            if not view.visible():  # no tool at all: say why, and what to ask for, instead of a bare dead end
                message += f". {nothing_visible_note(view.username, self.views.namespaces)}"
            self._refused(view, name, params.arguments, "DENY_UNKNOWN_ACTION", message)
            raise MCPError(types.INVALID_PARAMS, message, {"code": "DENY_UNKNOWN_ACTION", "message": message})
        listed = name in catalog.listed
        holder = holder_of(ctx, (params.arguments or {}).get("holder"))
        result = await tool.answer(Call(view, self.services, holder), dict(params.arguments or {}))
        data = result.structured_content if isinstance(result.structured_content, dict) else {}
        code = data.get("code")
        outcome = ("rate_limited" if code == "RATE_LIMITED" else "error") if result.is_error else (code or "ok")
        metrics.TOOL_CALLS.labels(tool=name if listed else "device_tool", outcome=outcome).inc()
        if isinstance(data.get("results"), list):  # a group: its members refused before any Intent are on record
            for member in data["results"]:
                if not member.get("intent"):
                    self._refused(view, name, {**(params.arguments or {}), "device_id": member.get("device_id")},
                                  str(member.get("code")), str(member.get("message", "")))
        elif result.is_error:
            self._refused(view, name, params.arguments, str(code), str(data.get("message", "")))
        elif (name == "iot.control" or not listed) and waits_for_a_person(data) and self.tasks.wanted(ctx):
            # The tasks extension (SEP-2663): the Intent awaiting approval, as a task to poll, instead.
            namespace, _, intent_name = str(data["intent"]).partition("/")
            with contextlib.suppress(ApiError):  # unreadable as the caller: no task it could poll
                task = await self.tasks.created_for(view, namespace, intent_name)
                if task is not None:
                    return task
        return result

    def _refused(self, view: CallerView, tool: str, arguments: Any, code: str, message: str) -> None:
        """A refusal on record: it never became an Intent, so the controller's log does not have it."""
        if self.audit is None:
            return
        shown = json.dumps(arguments or {}, sort_keys=True, default=str)
        self.audit.note("gateway.refused", view.username or "anonymous", {
            "tool": tool[:128], "code": code, "message": message[:1024],
            "arguments": shown if len(shown) <= MAX_AUDITED_ARGUMENTS else shown[:MAX_AUDITED_ARGUMENTS] + "...",
        })

    # ---- resources --------------------------------------------------------------------------------------------

    async def list_resources(self, ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListResourcesResult:
        return resources.listing(await self.view(ctx))

    async def list_resource_templates(self, ctx: ServerRequestContext[Any, Any], params: Any
                                      ) -> types.ListResourceTemplatesResult:
        return resources.templates()

    async def read_resource(self, ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
                            ) -> types.ReadResourceResult:
        return resources.read(await self.view(ctx), str(params.uri))

    async def subscribe(self, ctx: ServerRequestContext[Any, Any], params: types.SubscribeRequestParams
                        ) -> types.EmptyResult:
        view = await self.view(ctx)
        uri = str(params.uri)
        if not resources.may_listen(view, uri):
            raise MCPError(resources.RESOURCE_NOT_FOUND, f"Resource not found: {uri}")
        view.audience.subscribe(ctx.session, uri)
        return types.EmptyResult()

    async def unsubscribe(self, ctx: ServerRequestContext[Any, Any], params: types.UnsubscribeRequestParams
                          ) -> types.EmptyResult:
        view = await self.view(ctx)
        view.audience.unsubscribe(ctx.session, str(params.uri))
        return types.EmptyResult()

    async def listen(self, ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
                     ) -> types.SubscriptionsListenResult:
        if (params.notifications.model_extra or {}).get("taskIds") and not self.tasks.wanted(ctx):
            raise tasks.missing_extension()  # SEP-2663; with it, task ids are not agreed to (the ack omits them)
        view = await self.view(ctx)
        wanted = params.notifications.resource_subscriptions or []
        allowed = [uri for uri in wanted if resources.may_listen(view, uri)]
        if len(allowed) != len(wanted):
            # URIs the caller may not follow are dropped silently: an error would confirm they exist.
            params = params.model_copy(update={"notifications": params.notifications.model_copy(
                update={"resource_subscriptions": allowed})})
        return await view.audience.listen(ctx, params)

    # ---- prompts ----------------------------------------------------------------------------------------------

    async def list_prompts(self, ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[prompts.DIAGNOSE])

    async def get_prompt(self, ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams
                         ) -> types.GetPromptResult:
        if params.name != "diagnose_device":
            raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {params.name}")
        return await prompts.diagnose(await self.view(ctx), params.arguments)

    async def complete(self, ctx: ServerRequestContext[Any, Any], params: types.CompleteRequestParams
                       ) -> types.CompleteResult:
        """Device ids for the prompt's device_id and the device template's namespace and name: visible ones only."""
        view = await self.view(ctx)
        chosen = ((params.context.arguments if params.context else None) or {}).get("namespace")
        candidates = resources.completions(view, params.ref, params.argument.name, chosen)
        values = [c for c in candidates if c.startswith(params.argument.value)]
        return types.CompleteResult(completion=types.Completion(
            values=values[:100], total=len(values), has_more=len(values) > 100))

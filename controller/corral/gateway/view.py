"""One caller's view of the fleet: a watch cache of the Devices it may read, kept with its own token.

Every view lists and watches Devices with the caller's credentials (a thread per
namespace, or per device when the caller may only `get` named ones), reviews the
caller's RBAC rules every `access_refresh_s`, and fetches Capabilities by name.
Tools, resources and lists are answered from this cache without an API call,
and every change that alters what the caller sees is told to its clients
(notify.Audience): a device appearing, disappearing, going on- or offline,
changing contract, or a change of the caller's RBAC.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

import kubernetes
from pydantic import ValidationError

from corral.api.codes import GROUP, VERSION
from corral.api.intent import OVERLAY_VERB
from corral.api.pause import PAUSE_NAME, Paused, paused_of
from corral.client.intents import identity
from corral.contract.model import Contract
from corral.decide.approvals import DEFAULT_PEOPLE, People
from corral.gateway.access import Access, NamespaceAccess, rules_from_review
from corral.gateway.blocking import blocking
from corral.gateway.identity import Caller
from corral.gateway.notify import TOOLS, Audience
from corral.gateway.toolset import Grants, device_tools, fixed_tools
from corral.gateway.unseen import nothing_visible_note
from corral.gateway.visible import INDEX_URI, VisibleDevice, device_uri

log = logging.getLogger(__name__)

Key = tuple[str, str]  # namespace, name
PAUSE_TTL_S = 2.0  # how long a read of the agents kill switch answers for (the controller decides anyway)


class Capabilities:
    """Contracts by Capability name, shared by all views: a Capability is content-addressed and immutable,
    so once read it never changes. Each view still reads a name once with its own token before using it."""

    def __init__(self) -> None:
        self.contracts: dict[str, Contract | None] = {}


class CallerView:
    def __init__(self, caller: Caller, namespaces: list[str], capabilities: Capabilities, *,
                 access_refresh_s: float = 30.0, min_interval_s: float = 1.0, device_tools_on: bool = False,
                 people: People = DEFAULT_PEOPLE) -> None:
        self.caller = caller
        self.people = people  # who is a person, as the controller is told (a pause does not stop them)
        self._pauses: tuple[float, dict[str, Paused]] | None = None  # (read at, namespace -> pause)
        # One client per caller, kept: its connection pool spares every tool call a TLS handshake.
        self.client = caller.new_client()
        self.follower = caller.new_follower(
            lambda ns: self.access.may(ns, "list", "intents") and self.access.may(ns, "watch", "intents"))
        self.namespaces = namespaces
        self.capabilities = capabilities
        self.access_refresh_s = access_refresh_s
        self.device_tools_on = device_tools_on
        self.username: str | None = None
        self.groups: tuple[str, ...] = ()  # as the API server authenticated the caller; Intents carry them
        self.access = Access()
        self.audience = Audience(self._snapshot_uris, self._uri_visible, min_interval_s)
        self.last_used = time.monotonic()
        self._bodies: dict[Key, dict[str, Any]] = {}
        self._readable_caps: set[str] = set()
        self._visible: list[VisibleDevice] | None = None
        self._by_key: dict[Key, VisibleDevice] = {}
        self._tools: list[dict[str, Any]] | None = None
        self.memo: dict[str, Any] = {}  # derived from the tool list (e.g. SDK objects); cleared with it
        self._device_tools: dict[str, Any] | None = None
        self._scopes: dict[str, threading.Event] = {}  # watch scope -> its stop flag
        self._listed: set[str] = set()
        self._first_list = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._fetches: set[asyncio.Task[Any]] = set()  # Capability reads in flight
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- life cycle -------------------------------------------------------------------------------------------

    async def start(self, ready_timeout_s: float = 10.0) -> None:
        self._loop = asyncio.get_running_loop()
        await self._refresh_access()
        self._tasks.append(self._loop.create_task(self._keep_access_fresh()))
        try:
            await asyncio.wait_for(self._first_list.wait(), ready_timeout_s)
            # Contracts of the devices listed so far, so that the first tools/list is complete.
            await asyncio.wait_for(asyncio.gather(*self._fetches, return_exceptions=True), ready_timeout_s)
        except TimeoutError:
            log.warning("view of %s: not every device list arrived within %.0f s", self.username, ready_timeout_s)

    def stop(self) -> None:
        for task in [*self._tasks, *self._fetches]:
            task.cancel()
        for flag in self._scopes.values():
            flag.set()
        self._scopes.clear()
        self.audience.close()
        self.client.close()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.create_task(self.follower.close())

    # ---- what the caller sees ---------------------------------------------------------------------------------

    def visible(self) -> list[VisibleDevice]:
        if self._visible is None:
            out = []
            for (ns, name), body in sorted(self._bodies.items()):
                levels = self.access.levels(ns, name)
                if "read" not in levels:
                    continue
                out.append(VisibleDevice(ns, name, body, self._contract_of(body), levels))
            self._visible = out
            self._by_key = {(d.namespace, d.name): d for d in out}
        return self._visible

    def find(self, device_id: Any) -> VisibleDevice | None:
        """A visible device by namespace/name, or by bare name when exactly one visible device has it."""
        if not isinstance(device_id, str):
            return None
        self.visible()
        if "/" in device_id:
            ns, _, name = device_id.partition("/")
            return self._by_key.get((ns, name))
        matches = [d for (_, name), d in self._by_key.items() if name == device_id]
        return matches[0] if len(matches) == 1 else None

    def mqtt_id_of(self, device_id: str) -> str | None:
        device = self.find(device_id)
        return (device.body.get("spec") or {}).get("deviceId") if device else None

    def grants(self) -> Grants:
        return Grants(
            create_intents=frozenset(ns for ns in self.namespaces if self.access.may(ns, "create", "intents")),
        )

    def annotatable(self) -> list[VisibleDevice]:
        """Devices whose overlay the caller may set (by Intent): the `annotate` verb, not `patch`."""
        return [d for d in self.visible() if self.access.may(d.namespace, OVERLAY_VERB, name=d.name)]

    def tools(self) -> list[dict[str, Any]]:
        """Tool definitions for this caller, rebuilt only after a change."""
        if self._tools is None:
            devices, grants = self.visible(), self.grants()
            tools = fixed_tools(devices, grants, self.annotatable())
            if self.device_tools_on:
                tools += [definition for _, _, definition in self.device_tool_map().values()]
            self._tools = tools
        return self._tools

    def device_tool_map(self) -> dict[str, Any]:
        if self._device_tools is None:
            self._device_tools = device_tools(self.visible(), self.grants())
        return self._device_tools

    def now(self) -> datetime:
        return datetime.now(UTC)

    def is_person(self) -> bool:
        return self.people.includes(self.username or "")

    async def pauses(self) -> dict[str, Paused]:
        """Where agents are paused among the served namespaces, as far as the caller may read the switch (its
        AgentPause, with the caller's own rights); read again after PAUSE_TTL_S. A read that fails keeps the last."""
        now = time.monotonic()
        if self._pauses is None or now - self._pauses[0] > PAUSE_TTL_S:
            try:
                self._pauses = (now, await blocking(self._read_pauses))
            except Exception as err:  # noqa: BLE001 - the API server unreachable: the controller still decides
                log.info("view of %s: cannot read the agents switch: %s", self.username, err)
                self._pauses = (now, self._pauses[1] if self._pauses else {})
        return self._pauses[1]

    def _read_pauses(self) -> dict[str, Paused]:
        objects = kubernetes.client.CustomObjectsApi(self.client)
        found = {}
        for ns in self.namespaces:
            if not self.access.may(ns, "get", "agentpauses", name=PAUSE_NAME):
                continue
            try:
                body = objects.get_namespaced_custom_object(GROUP, VERSION, ns, "agentpauses", PAUSE_NAME,
                                                            _request_timeout=10)
            except kubernetes.client.ApiException as err:
                if err.status in (403, 404):
                    continue
                raise
            paused = paused_of(body)
            if paused is not None:
                found[ns] = paused
        return found

    # ---- RBAC -------------------------------------------------------------------------------------------------

    async def _keep_access_fresh(self) -> None:
        while True:
            await asyncio.sleep(self.access_refresh_s)
            try:
                await self._refresh_access()
            except Exception as err:  # noqa: BLE001 - keep serving the last known rules
                log.warning("view of %s: RBAC review failed, keeping the last rules: %s", self.username, err)

    async def _refresh_access(self) -> None:
        (username, groups), access = await blocking(self._review)
        self.username, self.groups = username, groups
        if access.signature() == self.access.signature():
            return
        self.access = access
        self._invalidate(tools=True)
        self._rewatch()

    def _review(self) -> tuple[tuple[str, tuple[str, ...]], Access]:
        client = self.client
        auth = kubernetes.client.AuthorizationV1Api(client)
        reviews = []
        for ns in self.namespaces:
            review = auth.create_self_subject_rules_review({"spec": {"namespace": ns}})
            rules = rules_from_review(client.sanitize_for_serialization(review.status))
            reviews.append(NamespaceAccess(ns, rules))
        try:
            me = identity(client)
            who = (me.username, me.groups)
        except kubernetes.client.ApiException:
            who = (self.caller.key[:20], ())
        return who, Access.of(reviews)

    # ---- the watch cache --------------------------------------------------------------------------------------

    def _wanted_scopes(self) -> set[str]:
        """`ns` to watch a whole namespace, `ns/name` to watch one device the caller may only get by name."""
        scopes = set()
        for ns in self.namespaces:
            rules = self.access.namespaces.get(ns)
            if rules is None:
                continue
            if rules.listable():
                scopes.add(ns)
            else:
                scopes |= {f"{ns}/{name}" for name in rules.named_devices()
                           if rules.may("list", name=name) and rules.may("watch", name=name)}
        return scopes

    def _rewatch(self) -> None:
        wanted = self._wanted_scopes()
        for scope in set(self._scopes) - wanted:
            self._scopes.pop(scope).set()
            self._forget_scope(scope)
        for scope in wanted - set(self._scopes):
            flag = threading.Event()
            self._scopes[scope] = flag
            threading.Thread(target=self._watch, args=(scope, flag), name=f"watch {scope}", daemon=True).start()
        if not wanted:
            self._first_list.set()

    def _watch(self, scope: str, stop: threading.Event) -> None:
        ns, _, name = scope.partition("/")
        selector = f"metadata.name={name}" if name else None
        assert self._loop is not None
        with self.caller.new_client() as client:
            objects = kubernetes.client.CustomObjectsApi(client)
            backoff = 0.5
            while not stop.is_set():
                try:
                    listed = objects.list_namespaced_custom_object(
                        GROUP, VERSION, ns, "devices", field_selector=selector, _request_timeout=30)
                    self._loop.call_soon_threadsafe(self._on_list, scope, listed.get("items") or [])
                    version = listed["metadata"]["resourceVersion"]
                    while not stop.is_set():
                        stream = kubernetes.watch.Watch().stream(
                            objects.list_namespaced_custom_object, GROUP, VERSION, ns, "devices",
                            field_selector=selector, resource_version=version, timeout_seconds=20,
                            allow_watch_bookmarks=True, _request_timeout=30)
                        for event in stream:
                            if stop.is_set():
                                return
                            obj = event["object"]
                            version = obj.get("metadata", {}).get("resourceVersion", version)
                            if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                                self._loop.call_soon_threadsafe(self._on_event, event["type"], obj)
                    backoff = 0.5
                except kubernetes.client.ApiException as err:
                    if err.status != 410:  # 410: the version expired; list again at once
                        log.info("watch %s for %s: %s %s; retrying", scope, self.username, err.status, err.reason)
                        stop.wait(backoff)
                        backoff = min(backoff * 2, 10)
                except Exception as err:  # noqa: BLE001 - network trouble: list again after a pause
                    if stop.is_set():
                        return
                    log.info("watch %s for %s broke: %s; retrying", scope, self.username, err)
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 10)

    def _on_list(self, scope: str, items: list[dict[str, Any]]) -> None:
        if scope not in self._scopes:
            return
        fresh = {(i["metadata"]["namespace"], i["metadata"]["name"]): i for i in items}
        for key in [k for k in self._bodies if _in_scope(k, scope) and k not in fresh]:
            self._on_event("DELETED", self._bodies[key])
        for item in items:
            self._on_event("MODIFIED", item)
        self._listed.add(scope)
        if self._listed >= set(self._scopes):
            self._first_list.set()

    def _forget_scope(self, scope: str) -> None:
        self._listed.discard(scope)
        for key in [k for k in self._bodies if _in_scope(k, scope)]:
            self._on_event("DELETED", self._bodies[key])

    def _on_event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        before = self._bodies.get(key)
        if kind == "DELETED":
            if self._bodies.pop(key, None) is None:
                return
        else:
            if before is not None and before.get("metadata", {}).get("resourceVersion") == meta.get("resourceVersion"):
                return
            self._bodies[key] = obj
        self._fetch_capability_if_new(obj if kind != "DELETED" else None)
        shape_changed = kind == "DELETED" or before is None or _shape(before) != _shape(obj)
        self._invalidate(tools=shape_changed or _overlay(before) != _overlay(obj))
        if "read" in self.access.levels(*key):
            self.audience.changed(device_uri(*key))
            if shape_changed:
                self.audience.changed(INDEX_URI)

    def _invalidate(self, tools: bool) -> None:
        self._visible = None
        if tools:
            self._tools = None
            self._device_tools = None
            self.memo.clear()
            if self._loop is not None and self._first_list.is_set():
                self.audience.changed(TOOLS)

    # ---- contracts --------------------------------------------------------------------------------------------

    def _contract_of(self, body: dict[str, Any]) -> Contract | None:
        status = body.get("status") or {}
        name = trusted_capability(status)
        accepted = any(c.get("type") == "ContractValid" and c.get("status") == "True" for c in status.get("conditions") or [])
        if not name or not accepted or name not in self._readable_caps:
            return None
        return self.capabilities.contracts.get(name)

    def _fetch_capability_if_new(self, body: dict[str, Any] | None) -> None:
        name = trusted_capability((body or {}).get("status") or {})
        if not name or name in self._readable_caps or self._loop is None:
            return
        self._readable_caps.add(name)  # one fetch in flight per name
        task = self._loop.create_task(self._fetch_capability(name))
        self._fetches.add(task)
        task.add_done_callback(self._fetches.discard)

    async def _fetch_capability(self, name: str) -> None:
        try:
            spec = await blocking(self._get_capability, name)
        except kubernetes.client.ApiException as err:
            log.info("view of %s cannot read Capability %s: %s %s", self.username, name, err.status, err.reason)
            self._readable_caps.discard(name)
            return
        if name not in self.capabilities.contracts:
            try:
                self.capabilities.contracts[name] = Contract.model_validate(
                    {"device_id": "capability", **{k: spec.get(k) for k in ("name", "model", "fw")},
                     "sensors": spec.get("sensors") or [], "actuators": spec.get("actuators") or [],
                     "events": spec.get("events") or []})
            except ValidationError as err:
                log.warning("Capability %s does not hold a valid contract: %s", name, err)
                self.capabilities.contracts[name] = None
        self._invalidate(tools=True)
        for device in self.visible():
            if trusted_capability(device.status) == name:
                self.audience.changed(device.uri)

    def _get_capability(self, name: str) -> dict[str, Any]:
        body = kubernetes.client.CustomObjectsApi(self.client).get_cluster_custom_object(
            GROUP, VERSION, "capabilities", name)
        return body.get("spec") or {}

    # ---- notices ----------------------------------------------------------------------------------------------

    def _snapshot_uris(self) -> list[str]:
        return [INDEX_URI] + [d.uri for d in self.visible()]

    def _uri_visible(self, uri: str) -> bool:
        if uri == INDEX_URI:
            return True
        ns, _, name = uri.removeprefix("corral://devices/").partition("/")
        return self.find(f"{ns}/{name}") is not None


def trusted_capability(status: dict[str, Any]) -> str | None:
    """The contract agents are shown: the one the controller trusts. While a changed contract waits for a person
    (ContractAccepted=False), that is the accepted one, not what the device now announces."""
    return status.get("acceptedCapability") or status.get("capability")


def _in_scope(key: Key, scope: str) -> bool:
    ns, _, name = scope.partition("/")
    return key[0] == ns and (not name or key[1] == name)


def _shape(body: dict[str, Any] | None) -> tuple[Any, ...]:
    """What the tool list depends on: existence, online state and contract."""
    status = (body or {}).get("status") or {}
    accepted = any(c.get("type") == "ContractValid" and c.get("status") == "True" for c in status.get("conditions") or [])
    return (body is not None, bool(status.get("online")), trusted_capability(status), accepted)


def _overlay(body: dict[str, Any] | None) -> Any:
    return ((body or {}).get("spec") or {}).get("overlay")


MAX_VIEWS_PER_CALLER = 8


def crowded(views: list[tuple[str, str | None, float, int]], username: str, keep: int) -> list[str]:
    """Of (key, username, last used, listeners), the keys of `username`'s views to stop so that `keep` remain:
    the least recently used first, never one with listeners."""
    own = [v for v in views if v[1] == username]
    idle = sorted((v for v in own if v[3] == 0), key=lambda v: v[2])
    return [v[0] for v in idle[:max(0, len(own) - keep)]]


class Views:
    """The views of all callers, by token; an idle view without listeners is stopped after `idle_s`.

    A view is a token's (it acts with it), but one username keeps at most `max_per_caller` of them: whoever
    holds a ServiceAccount mints tokens at will, and every view holds watches and a thread."""

    def __init__(self, namespaces: list[str], *, idle_s: float = 600.0, max_per_caller: int = MAX_VIEWS_PER_CALLER,
                 **view_options: Any) -> None:
        self.namespaces = namespaces
        self.capabilities = Capabilities()
        self.idle_s = idle_s
        self.max_per_caller = max_per_caller
        self.view_options = view_options
        self._views: dict[str, CallerView] = {}
        self._starting: dict[str, asyncio.Task[CallerView]] = {}

    async def of(self, caller: Caller) -> CallerView:
        view = self._views.get(caller.key)
        if view is None:
            task = self._starting.get(caller.key)
            if task is None:
                self._make_room(caller.username)
                task = asyncio.get_running_loop().create_task(self._start(caller))
                self._starting[caller.key] = task
            view = await asyncio.shield(task)
        view.last_used = time.monotonic()
        self._expire()
        return view

    async def _start(self, caller: Caller) -> CallerView:
        view = CallerView(caller, self.namespaces, self.capabilities, **self.view_options)
        try:
            await view.start()
            if not view.visible():
                log.warning("%s", nothing_visible_note(view.username, self.namespaces))
            self._views[caller.key] = view
            return view
        finally:
            self._starting.pop(caller.key, None)

    def _make_room(self, username: str | None) -> None:
        if username is None:
            return
        entries = [(key, v.caller.username, v.last_used, v.audience.listeners) for key, v in self._views.items()]
        for key in crowded(entries, username, self.max_per_caller - 1):
            log.info("view of %s: stopped, %d newer views of the same caller (one per token)", username,
                     self.max_per_caller - 1)
            self._views.pop(key).stop()

    def _expire(self) -> None:
        now = time.monotonic()
        for key, view in list(self._views.items()):
            if now - view.last_used > self.idle_s and view.audience.listeners == 0:
                view.stop()
                del self._views[key]

    def stop(self) -> None:
        for view in self._views.values():
            view.stop()
        self._views.clear()

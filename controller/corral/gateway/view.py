"""One caller's view of the fleet: the Devices it may read, kept with its own token, and what it may do.

A view puts together five parts, each in a module of its own: the watch of the caller's Devices
(`devices.DeviceWatch`, on kube.informer.Informer, a scope per namespace or per device the caller may only
`get` by name), the RBAC review (`review.AccessReview`, again every `access_refresh_s`), the contracts of
their Capabilities (`contracts.ContractReader`), the agents switch (`pauses.PauseReader`), and a memo of what is
derived from what the caller sees (its tools: `toolset.catalog`), cleared whenever that changes. Tools,
resources and lists are answered from here without an API call, and every change that alters what the caller
sees is told to its clients (notify.Audience): a device appearing, disappearing, going on- or offline,
changing contract, or a change of the caller's RBAC.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

from corral.api.device import Device
from corral.api.intent import OVERLAY_VERB
from corral.api.pause import PAUSE_NAME, Paused
from corral.contract.model import Contract
from corral.decide.approvals import DEFAULT_PEOPLE, People
from corral.gateway.access import Access
from corral.gateway.contracts import Capabilities, ContractReader
from corral.gateway.devices import DeviceWatch
from corral.gateway.identity import Caller
from corral.gateway.notify import TOOLS, Audience
from corral.gateway.pauses import PauseReader
from corral.gateway.review import AccessReview, Who
from corral.gateway.unseen import nothing_visible_note
from corral.gateway.visible import INDEX_URI, Grants, VisibleDevice, device_uri
from corral.kube.cache import Key

__all__ = ["CallerView", "Capabilities", "Views", "crowded", "trusted_capability"]

log = logging.getLogger(__name__)


class CallerView:
    def __init__(self, caller: Caller, namespaces: list[str], capabilities: Capabilities, *,
                 access_refresh_s: float = 30.0, min_interval_s: float = 1.0, device_tools_on: bool = False,
                 people: People = DEFAULT_PEOPLE) -> None:
        self.caller = caller
        self.people = people  # who is a person, as the controller is told (a pause does not stop them)
        # One client per caller, kept: its connection pool spares every tool call a TLS handshake.
        self.client = caller.new_client()
        api = caller.new_api()  # on the event loop: the watches, Intents, Capabilities and the agents switch
        self.follower = caller.new_follower(
            lambda ns: self.access.may(ns, "list", "intents") and self.access.may(ns, "watch", "intents"), api)
        self.namespaces = namespaces
        self.device_tools_on = device_tools_on
        self.username: str | None = None
        self.groups: tuple[str, ...] = ()  # as the API server authenticated the caller; Intents carry them
        self.access = Access()
        self.audience = Audience(self._snapshot_uris, self._uri_visible, min_interval_s)
        self.last_used = time.monotonic()
        self.memo: dict[str, Any] = {}  # the caller's tools and what derives from them; cleared with them
        self.review = AccessReview(caller, self.client, namespaces, access_refresh_s)
        self.watch = DeviceWatch(api, self._changed, lambda: self.username)
        self.contracts = ContractReader(api, capabilities, self._contract_read, lambda: self.username)
        self.pause_reader = PauseReader(api, namespaces, lambda ns: self.access.may(
            ns, "get", "agentpauses", name=PAUSE_NAME), lambda: self.username)
        self._visible: list[VisibleDevice] | None = None
        self._by_key: dict[Key, VisibleDevice] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- life cycle -------------------------------------------------------------------------------------------

    async def start(self, ready_timeout_s: float = 10.0) -> None:
        self._loop = asyncio.get_running_loop()
        self._apply(*await self.review.review())
        self._tasks.append(self._loop.create_task(self.review.keep_fresh(self._apply, lambda: self.username)))
        try:
            await asyncio.wait_for(self.watch.first_list.wait(), ready_timeout_s)
            # Contracts of the devices listed so far, so that the first tools/list is complete.
            await asyncio.wait_for(asyncio.gather(*self.contracts.fetches, return_exceptions=True), ready_timeout_s)
        except TimeoutError:
            log.warning("view of %s: not every device list arrived within %.0f s", self.username, ready_timeout_s)

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.contracts.stop()
        self.audience.close()
        self.client.close()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.create_task(self._close())

    async def _close(self) -> None:
        await self.watch.stop()
        await self.follower.close()  # and the caller's asynchronous client, which the watch shared

    # ---- what the caller sees ---------------------------------------------------------------------------------

    def visible(self) -> list[VisibleDevice]:
        if self._visible is None:
            out = []
            for key, device in sorted(self.watch.devices.items()):
                levels = self.access.levels(*key)
                if "read" not in levels:
                    continue
                out.append(VisibleDevice(*key, self.watch.bodies[key], self._contract_of(device), levels))
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
        model = self.watch.devices.get((device.namespace, device.name)) if device else None
        return model.spec.device_id if model else None

    def grants(self) -> Grants:
        return Grants(
            create_intents=frozenset(ns for ns in self.namespaces if self.access.may(ns, "create", "intents")),
        )

    def annotatable(self) -> list[VisibleDevice]:
        """Devices whose overlay the caller may set (by Intent): the `annotate` verb, not `patch`."""
        return [d for d in self.visible() if self.access.may(d.namespace, OVERLAY_VERB, name=d.name)]

    def now(self) -> datetime:
        return datetime.now(UTC)

    def is_person(self) -> bool:
        return self.people.includes(self.username or "")

    async def pauses(self) -> dict[str, Paused]:
        """Where agents are paused among the served namespaces, as far as the caller may read the switch."""
        return await self.pause_reader.pauses()

    # ---- changes ----------------------------------------------------------------------------------------------

    def _apply(self, who: Who, access: Access) -> None:
        """A review's answer: the caller's name and groups, and (when they changed) its rules and watches."""
        self.username, self.groups = who
        if access.signature() == self.access.signature():
            return
        self.access = access
        self._invalidate(tools=True)
        self.watch.watch(self._wanted_scopes())

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

    def _changed(self, key: Key, before: Device | None, after: Device | None) -> None:
        """A Device of the watch changed (after None: it is gone)."""
        if after is not None:
            self.contracts.fetch_if_new(trusted_capability(after))
        shape_changed = after is None or before is None or _shape(before) != _shape(after)
        self._invalidate(tools=shape_changed or _overlay(before) != _overlay(after))
        if "read" in self.access.levels(*key):
            self.audience.changed(device_uri(*key))
            if shape_changed:
                self.audience.changed(INDEX_URI)

    def _contract_read(self, name: str) -> None:
        self._invalidate(tools=True)
        for device in self.visible():
            model = self.watch.devices.get((device.namespace, device.name))
            if model is not None and trusted_capability(model) == name:
                self.audience.changed(device.uri)

    def _invalidate(self, tools: bool) -> None:
        self._visible = None
        if tools:
            self.memo.clear()
            if self._loop is not None and self.watch.first_list.is_set():
                self.audience.changed(TOOLS)

    def _contract_of(self, device: Device) -> Contract | None:
        name = trusted_capability(device)
        if not name or not _accepted(device):
            return None
        return self.contracts.contract(name)

    # ---- notices ----------------------------------------------------------------------------------------------

    def _snapshot_uris(self) -> list[str]:
        return [INDEX_URI] + [d.uri for d in self.visible()]

    def _uri_visible(self, uri: str) -> bool:
        if uri == INDEX_URI:
            return True
        ns, _, name = uri.removeprefix("corral://devices/").partition("/")
        return self.find(f"{ns}/{name}") is not None


def trusted_capability(device: Device) -> str | None:
    """The contract agents are shown: the one the controller trusts. While a changed contract waits for a person
    (ContractAccepted=False), that is the accepted one, not what the device now announces."""
    status = device.status
    return (status.accepted_capability or status.capability) if status is not None else None


def _accepted(device: Device) -> bool:
    status = device.status
    return status is not None and any(c.type == "ContractValid" and c.status == "True" for c in status.conditions)


def _shape(device: Device) -> tuple[Any, ...]:
    """What the tool list depends on: online state and contract."""
    online = bool(device.status.online) if device.status is not None else False
    return (online, trusted_capability(device), _accepted(device))


def _overlay(device: Device | None) -> Any:
    return device.spec.overlay if device is not None else None


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
    holds a ServiceAccount mints tokens at will, and every view holds watches and connections."""

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

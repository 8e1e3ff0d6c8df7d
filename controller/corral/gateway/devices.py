"""The Devices one caller may read, listed and watched with the caller's own credentials, on the event loop.

One kube.informer.Informer per scope: a namespace where the caller may list and watch every Device, or one
device it may only get by name (a field selector on its name). Bodies become Device models as they enter
(kube.typed.parse); a body the model refuses is left out of the view and logged, never a crash.
`on_change(key, before, after)` hears every change (after None: the device is gone from the view).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from corral.api.codes import GROUP, VERSION
from corral.api.device import Device
from corral.kube.cache import Key, key_of
from corral.kube.client import AsyncApi
from corral.kube.informer import Informer
from corral.kube.tasks import cancel_all
from corral.kube.typed import Body, Malformed, parse

log = logging.getLogger(__name__)

OnChange = Callable[[Key, Device | None, Device | None], None]


def in_scope(key: Key, scope: str) -> bool:
    ns, _, name = scope.partition("/")
    return key[0] == ns and (not name or key[1] == name)


class DeviceWatch:
    def __init__(self, api: AsyncApi, on_change: OnChange, who: Callable[[], str | None]) -> None:
        self.api = api
        self.devices: dict[Key, Device] = {}  # as the model reads them
        self.bodies: dict[Key, Body] = {}  # as the API server sent them (the tools show some fields as written)
        self.on_change = on_change
        self.who = who
        self.first_list = asyncio.Event()  # every scope watched at the first review was listed once
        self._informers: dict[str, Informer] = {}  # scope -> its informer
        self._tasks: set[asyncio.Task[Any]] = set()

    def watch(self, wanted: set[str]) -> None:
        """Watch exactly these scopes (`ns`, or `ns/name`): new ones are listed, dropped ones forgotten."""
        for scope in set(self._informers) - wanted:
            self._spawn(self._informers.pop(scope).stop())
            self._forget(scope)
        for scope in wanted - set(self._informers):
            ns, _, name = scope.partition("/")
            informer = Informer(self.api, GROUP, VERSION, "devices", "", (ns,), self._handler(scope),
                                field_selector=f"metadata.name={name}" if name else "")
            self._informers[scope] = informer
            informer.start()
        if not self.first_list.is_set():
            self._spawn(self._listed([i.synced for i in self._informers.values()]))

    async def stop(self) -> None:
        informers, self._informers = list(self._informers.values()), {}
        await cancel_all(self._tasks)
        for informer in informers:
            await informer.stop()

    def _handler(self, scope: str) -> Callable[[str, Body], None]:
        def handle(kind: str, body: Body) -> None:
            if scope in self._informers:  # a scope dropped meanwhile: its last events are not the view's
                self._event(kind, body)
        return handle

    async def _listed(self, synced: list[asyncio.Event]) -> None:
        await asyncio.gather(*(event.wait() for event in synced))
        self.first_list.set()

    def _event(self, kind: str, body: Body) -> None:
        key = key_of(body)
        before = self.devices.get(key)
        if kind == "DELETED":
            self._drop(key)
            return
        try:
            device = parse(Device, body)
        except Malformed as err:
            log.warning("view of %s: %s; it is left out", self.who(), err)
            self._drop(key)
            return
        if before is not None and before.metadata.resource_version == device.metadata.resource_version:
            return  # a list handing over what the watch had delivered already
        self.devices[key], self.bodies[key] = device, body
        self.on_change(key, before, device)

    def _drop(self, key: Key) -> None:
        before = self.devices.pop(key, None)
        self.bodies.pop(key, None)
        if before is not None:
            self.on_change(key, before, None)

    def _forget(self, scope: str) -> None:
        for key in [k for k in self.devices if in_scope(k, scope)]:
            self._drop(key)

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

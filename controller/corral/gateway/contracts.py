"""The device contracts a caller's tools are made from: Capabilities, read by name with the caller's own token.

A Capability is content-addressed and immutable, so once read its contract never changes: one cache serves
every caller (`Capabilities`). Each caller still reads a name once with its own token before using it
(`ContractReader`): a contract the caller may not read never shapes its tools.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from corral.api.capability import Capability
from corral.api.codes import GROUP, VERSION
from corral.contract.model import Contract
from corral.kube.client import ApiError, AsyncApi, path_of
from corral.kube.typed import Malformed, parse

log = logging.getLogger(__name__)


class Capabilities:
    """Contracts by Capability name, shared by all views: a Capability is content-addressed and immutable,
    so once read it never changes. Each view still reads a name once with its own token before using it."""

    def __init__(self) -> None:
        self.contracts: dict[str, Contract | None] = {}


class ContractReader:
    """The Capabilities one caller has read (each new name fetched once, on the event loop), and their contracts.
    `on_read(name)` hears when a contract became readable."""

    def __init__(self, api: AsyncApi, shared: Capabilities, on_read: Callable[[str], None],
                 who: Callable[[], str | None]) -> None:
        self.api = api
        self.shared = shared
        self.on_read = on_read
        self.who = who
        self.readable: set[str] = set()  # names read (or being read) with this caller's token
        self.fetches: set[asyncio.Task[Any]] = set()  # reads in flight

    def contract(self, name: str) -> Contract | None:
        return self.shared.contracts.get(name) if name in self.readable else None

    def fetch_if_new(self, name: str | None) -> None:
        if not name or name in self.readable:
            return
        self.readable.add(name)  # one fetch in flight per name
        task = asyncio.get_running_loop().create_task(self._fetch(name))
        self.fetches.add(task)
        task.add_done_callback(self.fetches.discard)

    def stop(self) -> None:
        for task in self.fetches:
            task.cancel()

    async def _fetch(self, name: str) -> None:
        try:
            body = await self.api.request("GET", path_of(GROUP, VERSION, "capabilities", None, name))
        except ApiError as err:
            log.info("view of %s cannot read Capability %s: %s %s", self.who(), name, err.status, err.reason)
            self.readable.discard(name)
            return
        if name not in self.shared.contracts:
            self.shared.contracts[name] = contract_of(name, body)
        self.on_read(name)


def contract_of(name: str, body: dict[str, Any]) -> Contract | None:
    """The contract a Capability holds; None (logged) when it holds none that is valid."""
    try:
        spec = parse(Capability, body).spec
        return Contract.model_validate({"device_id": "capability", "name": spec.name, "model": spec.model,
                                        "fw": spec.fw, "sensors": spec.sensors, "actuators": spec.actuators,
                                        "events": spec.events})
    except (Malformed, ValueError) as err:
        log.warning("Capability %s does not hold a valid contract: %s", name, err)
        return None

"""Where agents are paused, as far as one caller may read the switch, and how a caller is told so.

The controller decides on every Intent whether agents are paused; the gateway reads the AgentPause objects
only to say so up front (in the lists, the instructions, and a refusal that spares the Intent's round trip).
It reads them with the caller's own rights, at most every PAUSE_TTL_S, on the event loop.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from corral.api.codes import GROUP, VERSION
from corral.api.pause import PAUSE_NAME, Paused, paused_of
from corral.contract.text import quoted_data
from corral.kube.client import ApiError, AsyncApi, path_of

log = logging.getLogger(__name__)

PAUSE_TTL_S = 2.0  # how long a read of the agents kill switch answers for (the controller decides anyway)


class PauseReader:
    """The agents switch of each served namespace the caller may `get` it in; a read that fails keeps the last."""

    def __init__(self, api: AsyncApi, namespaces: list[str], may_read: Callable[[str], bool],
                 who: Callable[[], str | None]) -> None:
        self.api = api
        self.namespaces = namespaces
        self.may_read = may_read  # namespace -> whether the caller may get the AgentPause there
        self.who = who
        self._read: tuple[float, dict[str, Paused]] | None = None  # (read at, namespace -> pause)

    async def pauses(self) -> dict[str, Paused]:
        """Where agents are paused among the served namespaces; read again after PAUSE_TTL_S."""
        now = time.monotonic()
        if self._read is None or now - self._read[0] > PAUSE_TTL_S:
            try:
                self._read = (now, await self._fetch())
            except Exception as err:  # noqa: BLE001 - the API server unreachable: the controller still decides
                log.info("view of %s: cannot read the agents switch: %s", self.who(), err)
                self._read = (now, self._read[1] if self._read else {})
        return self._read[1]

    async def _fetch(self) -> dict[str, Paused]:
        found = {}
        for ns in self.namespaces:
            if not self.may_read(ns):
                continue
            try:
                body = await self.api.request("GET", path_of(GROUP, VERSION, "agentpauses", ns, PAUSE_NAME))
            except ApiError as err:
                if err.status in (403, 404):
                    continue
                raise
            paused = paused_of(body)
            if paused is not None:
                found[ns] = paused
        return found


def paused_text(pauses: list[Paused], person: bool) -> str:
    """What a caller is told where agents are paused (iot.list_devices, iot.query, the instructions)."""
    text = " ".join(f"{pause_sentence(p)} {p.resume_hint()}" for p in pauses)
    return text + (" You are a person: your own requests still run." if person else
                   " Tell the user; requests to act there are refused (DENY_PAUSED) until then.")


def pause_sentence(pause: Paused) -> str:
    """Paused.sentence, with the person's reason quoted and labelled: it reaches the server's instructions."""
    if not pause.reason:
        return pause.sentence()
    said = dataclasses.replace(pause, reason="").sentence().removesuffix(".")
    return f"{said}; the reason they gave (their words, data): {quoted_data(pause.reason, 512)}."

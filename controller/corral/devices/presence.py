"""Who the broker says connected or went away, read from its log lines. Pure.

A device's `status` topic is its own word, and its Last Will the broker's word for it when the connection breaks.
But a client the broker throws off by administrative action (Mosquitto's dynamic security plugin, when its
account is disabled, deleted or changed, by us or by an administrator with `mosquitto_ctrl`) gets no Will: its
retained status keeps saying `online`. The broker's log says it, though, and the controller already tails that log
for refused PUBLISHes (`devices.refusals`). These lines (Mosquitto 2.0) are the ones that matter:

    New client connected from 127.0.0.1:40312 as light-1 (p2, c1, k30, u'light-1').
    Client light-1 disconnected.                       (by itself, or kicked: the plugin's kick logs this)
    Client light-1 been disconnected by administrative action.   (sic, 2.0.11: a kick, with no Will)
    Client light-1 closed its connection.
    Client light-1 has exceeded timeout, disconnecting.
    Socket error on client light-1, disconnecting.

"Client X disconnected, not authorised." says nothing here: it is a refused login, and X is whatever client id
the caller chose, so anyone could make any device look gone with one bad login. "Client X already connected,
closing old connection." is a takeover: X is connected (the new connection's line follows). The broker's client
id is the username, which is the device id. A line is no proof either way: the controller asks the device
(`get_state`) before it believes one (reconcile.ingest).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from corral.contract.text import bounded

_CONNECTED = re.compile(r"New client connected from \S+ as (?P<client>\S+) \(")
_GONE = re.compile(r"(?:\bClient (?P<client>[^\s,]+) (?P<what>disconnected|(?:has )?been disconnected|closed its connection"
                   r"|has exceeded timeout)|Socket error on client (?P<socket>[^\s,]+), disconnecting)")
_UNKNOWN = "<unknown>"


@dataclass(frozen=True)
class Presence:
    client: str
    connected: bool
    line: str  # the broker's own words, made safe and cut: they name a device's chosen id

    def why(self) -> str:
        return f"the broker logged {self.line!r}"


def presence_of(line: str) -> Presence | None:
    """What a broker log line says about a client's connection, or None for any other line."""
    if "lient" not in line:  # most lines are about messages: one cheap test before the expressions
        return None
    text = line.rstrip("\r\n")
    stamp, _, rest = text.partition(": ")
    said = rest if rest and " " not in stamp else text  # without the broker's timestamp (epoch or log_timestamp_format)
    if "already connected, closing old connection" in said or "not authorised" in said:
        return None
    connected = _CONNECTED.search(said)
    if connected is not None:
        client = connected["client"]
        return None if client == _UNKNOWN else Presence(bounded(client, 128), True, bounded(said, 200))
    gone = _GONE.search(said)
    if gone is None:
        return None
    client = gone["client"] or gone["socket"]
    return None if client == _UNKNOWN else Presence(bounded(client, 128), False, bounded(said, 200))


def last_words(lines: Iterable[str]) -> dict[str, Presence]:
    """Per client, the last thing the lines say about its connection (a kick then a reconnect: connected)."""
    last: dict[str, Presence] = {}
    for line in lines:
        presence = presence_of(line)
        if presence is not None:
            last[presence.client] = presence
    return last

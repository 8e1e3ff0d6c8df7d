"""Which topics a bridged device may use, given the Devices people accepted already. Pure (issue 41, finding 7).

A person accepts a candidate for what it says it is (a low-risk light), and from then on the bridge publishes that
device's commands on the topics its discovery named. A source that announces a "light" whose command topic is a lock
already accepted (with `payload_on: UNLOCK`), or a state topic the bridge would then write, would turn an agent's
harmless "on" into an unlocked door. So the older Device keeps its topics: a component whose command topic is any
topic of another accepted Device, or whose state or availability topic is another's command topic, is left out of a
candidate with the reason (`screen`, shown on the DiscoveredDevice), refused at acceptance (client/bridge.py), and a
command for an accepted Device on such a topic is refused by the bridge (`taken`). Corral's own device topics (the
configured prefix, `iot` by default) are never a bridged device's either.

Who published a discovery message is not something a subscriber can see; the broker lets only a source's account
publish under its own node id, so the source of a candidate is the node id in the discovery topic
(bridge/discovery.py), never what the payload claims.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from corral.bridge.model import Discovered, LeftOut

COMMAND_KEYS = ("set_position_topic",)  # besides every `*command_topic`


@dataclass(frozen=True)
class Claim:
    """An accepted Device's topics, as a person accepted them (spec.bridge.topics)."""

    device: str  # the Device's name, for people
    device_id: str
    command: frozenset[str]
    topics: frozenset[str]  # command, state and availability


def component_topics(config: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """A component's command topics, and its other topics (state, availability, ...)."""
    command: set[str] = set()
    other: set[str] = set()
    for key, value in config.items():
        if isinstance(value, str) and key.endswith("topic"):
            (command if key.endswith("command_topic") or key in COMMAND_KEYS else other).add(value)
    entries = config.get("availability")
    for entry in entries if isinstance(entries, list) else [entries]:
        if isinstance(entry, dict) and isinstance(entry.get("topic"), str):
            other.add(entry["topic"])
    return command, other


def conflicts(command: Iterable[str], other: Iterable[str], claims: Iterable[Claim]) -> list[str]:
    """Why these topics are another Device's (empty: they are not)."""
    reasons: list[str] = []
    commands, others = set(command), set(other)
    for claim in claims:
        reasons += [f"its command topic {t!r} is already accepted for Device {claim.device} ({claim.device_id})"
                    for t in sorted(commands & claim.topics)]
        reasons += [f"its topic {t!r} is the command topic of Device {claim.device} ({claim.device_id})"
                    for t in sorted((others - commands) & claim.command)]
    return reasons


def reserved(topics: Iterable[str], device_prefix: str) -> list[str]:
    """Why these topics are Corral's own or the broker's (empty: none is)."""
    return [f"its topic {t!r} lies under Corral's device prefix {device_prefix!r} or the broker's '$'"
            for t in sorted(set(topics)) if t == device_prefix or t.startswith((device_prefix + "/", "$"))]


def screen(discovered: Discovered, device_prefix: str, claims: Iterable[Claim]) -> tuple[Discovered, list[str]]:
    """The device without the components whose topics are not its to use, each left out with the reason; and the
    sentences said (for the log)."""
    claims = list(claims)
    kept, left_out, said = [], list(discovered.left_out), []
    for component in discovered.components:
        command, other = component_topics(component.config)
        reasons = reserved(command | other, device_prefix) or conflicts(command, other, claims)
        if not reasons:
            kept.append(component)
            continue
        reason = "; ".join(reasons[:3]) + ": the bridge would publish there for it, so it is not offered"
        left_out.append(LeftOut(f"{component.component}.{component.object_id}", reason[:1].upper() + reason[1:] + "."))
        said.append(f"{discovered.key.source} {component.component}.{component.object_id}: {reason}")
    return replace(discovered, components=tuple(kept), left_out=tuple(left_out)), said


def taken(device_id: str, topics: Iterable[str], claims: Iterable[Claim]) -> list[str]:
    """Why a command for `device_id` may not be published on these topics: another (older) Device's."""
    return conflicts(topics, (), (c for c in claims if c.device_id != device_id))

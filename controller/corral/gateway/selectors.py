"""A group for iot.control: which visible devices a selector names, each member's request id, and the group's answer.

Pure: it reads the caller's visible devices (their bodies as the API server sent them) and the outcomes the
members ended with. A selector is `{labels: {key: value}}` (matchLabels), `{location: "Utility room"}` (normalized
as the controller makes the Device's `corral.dev/location` label, api/locations.py, and matched against that
label), or both. Only devices the caller can see are candidates, so a device it may not read is never part of a
group, nor named in an answer.

The group's answer never claims success for the whole when one member failed: its `code` is EXECUTED only when
every member executed (the one code when all ended alike, else MIXED), and it is an error (MCP `isError`) when any
member was refused or failed. Waiting for a person (AWAITING_APPROVAL, PENDING) is not a failure.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from corral.api.locations import LOCATION_LABEL, location_label
from corral.gateway.tools.arguments import CONTROL, ArgumentError
from corral.gateway.visible import VisibleDevice

MAX_GROUP: Final = 50  # devices one call may act on: a bigger fleet is several calls, each one readable in full
MAX_SELECTOR_LABELS: Final = 16
MIXED: Final = "MIXED"  # a group's code when its members ended differently
MAX_NAMED: Final = 5  # devices named per code in a group's summary; the results name them all
MAX_SHOWN: Final = 20  # locations and labels offered when a selector matched nothing

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_NAME})?$")

Standing = Literal["succeeded", "waiting", "failed"]


@dataclass(frozen=True)
class Selector:
    labels: dict[str, str] = field(default_factory=dict)
    location: str | None = None  # the label value (normalized)
    location_given: str | None = None  # as the caller wrote it

    def matches(self, device: VisibleDevice) -> bool:
        labels = labels_of(device)
        if self.location is not None and labels.get(LOCATION_LABEL) != self.location:
            return False
        return all(labels.get(k) == v for k, v in self.labels.items())

    def shown(self) -> str:
        """The selector in a sentence (label keys and values are of a restricted alphabet; the location is its
        label value): `location "utility-room" and labels kind=light`."""
        parts = []
        if self.location is not None:
            parts.append(f"location {self.location!r}")
        if self.labels:
            parts.append("labels " + ", ".join(f"{k}={v}" for k, v in sorted(self.labels.items())))
        return " and ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {**({"labels": dict(self.labels)} if self.labels else {}),
                **({"location": self.location} if self.location is not None else {})}


def labels_of(device: VisibleDevice) -> dict[str, str]:
    labels = (device.body.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def parse_selector(value: Any) -> Selector:
    """The selector argument, checked: ArgumentError (DENY_ARGUMENTS) says what is wrong and what is allowed."""
    if not isinstance(value, dict) or not value or set(value) - {"labels", "location"}:
        raise ArgumentError("selector must be {\"labels\": {key: value, ...}} and/or {\"location\": \"...\"} (a "
                            "location as iot.list_devices shows it).")
    labels = value.get("labels", {})
    if not isinstance(labels, dict) or len(labels) > MAX_SELECTOR_LABELS:
        raise ArgumentError(f"selector.labels must be an object of at most {MAX_SELECTOR_LABELS} key: value labels.")
    for key, label in labels.items():
        if not isinstance(key, str) or len(key) > 317 or not _LABEL_KEY.fullmatch(key):
            raise ArgumentError(f"selector.labels: {str(key)[:80]!r} is not a Kubernetes label key (prefix/name).")
        if not isinstance(label, str) or not _LABEL_VALUE.fullmatch(label):
            raise ArgumentError(f"selector.labels[{key}]: a label value is a string of at most 63 letters, digits, "
                                f"'-', '_' or '.', beginning and ending with a letter or digit; got {str(label)[:80]!r}.")
    given = value.get("location")
    if given is None:
        if not labels:
            raise ArgumentError("selector needs labels or a location; it may not be empty.")
        return Selector(dict(labels))
    if not isinstance(given, str) or not given.strip() or len(given) > 64 or CONTROL.search(given):
        raise ArgumentError("selector.location must be a location of 1-64 characters without control characters, "
                            "as iot.list_devices shows it.")
    normalized = location_label(given)
    if normalized is None:
        raise ArgumentError(f"selector.location {given!r} has no letters or digits, so no device can be there; give "
                            "a location as iot.list_devices shows it.")
    return Selector(dict(labels), normalized, given)


def resolve(devices: list[VisibleDevice], selector: Selector) -> list[VisibleDevice]:
    """The visible devices the selector matches, by device id."""
    return sorted((d for d in devices if selector.matches(d)), key=lambda d: d.id)


def nothing_matched(devices: list[VisibleDevice], selector: Selector) -> str:
    """Why a selector selected nothing, and what it could have selected among what the caller sees."""
    locations = Counter(labels_of(d).get(LOCATION_LABEL) for d in devices)
    locations.pop(None, None)
    pairs = Counter(f"{k}={v}" for d in devices for k, v in labels_of(d).items() if k != LOCATION_LABEL)
    where = ", ".join(f"{loc} ({n})" for loc, n in sorted(locations.items(), key=lambda i: str(i[0]))[:MAX_SHOWN])
    which = ", ".join(f"{pair} ({n})" for pair, n in sorted(pairs.items())[:MAX_SHOWN])
    return (f"No device you can see matches {selector.shown()}; nothing was requested. Locations of the devices you "
            f"can see (the corral.dev/location label, with how many devices): {where or 'none'}. Their labels: "
            f"{which or 'none'}. iot.list_devices shows each device's location.")


def too_many(count: int, selector: Selector) -> str:
    return (f"The selector ({selector.shown()}) matches {count} devices you can see; one call acts on at most "
            f"{MAX_GROUP}. Nothing was requested: narrow the selector (add a label) or split the group.")


def member_request_id(request_id: str, device: VisibleDevice) -> str:
    """A member's Intent name: the group's request_id, the device's name and a digest of both, at most 63
    characters. The same call made again names the same Intents (so a retry runs nothing twice), and two devices of
    one group (even of the same name in two namespaces) never share one."""
    digest = hashlib.sha256(f"{request_id}\n{device.id}".encode()).hexdigest()[:6]
    slug = re.sub(r"[^a-z0-9]+", "-", device.name.lower()).strip("-")
    head = f"{request_id}-{slug}"[:63 - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}"


def standing(result: dict[str, Any]) -> Standing:
    """How one member ended: executed (a retry's DEDUP of an executed Intent too), waiting, or refused/failed."""
    code, phase = result.get("code"), result.get("phase")
    if code == "EXECUTED" or (code == "DEDUP" and phase == "Succeeded"):
        return "succeeded"
    if code in ("AWAITING_APPROVAL", "PENDING") or (code == "DEDUP" and phase in ("Pending", "AwaitingApproval",
                                                                                   "Executing", None)):
        return "waiting"
    return "failed"


def group_answer(request_id: str, selector: Selector, results: list[dict[str, Any]], dry_run: bool
                 ) -> tuple[dict[str, Any], bool]:
    """The group's answer and whether it is an error (some member refused or failed)."""
    codes = Counter(str(r["code"]) for r in results)
    standings = Counter(standing(r) for r in results)
    code = next(iter(codes)) if len(codes) == 1 else MIXED
    summary = {"devices": len(results), "succeeded": standings["succeeded"], "waiting": standings["waiting"],
               "failed": standings["failed"], "codes": dict(sorted(codes.items(), key=lambda i: (-i[1], i[0])))}
    answer = {"request_id": request_id, "code": code, "message": summary_text(results, codes, dry_run),
              "dry_run": dry_run, "selector": selector.as_dict(), "summary": summary, "results": results}
    return answer, standings["failed"] > 0


def summary_text(results: list[dict[str, Any]], codes: Counter[str], dry_run: bool) -> str:
    """`4 of 5 EXECUTED; 1 DEVICE_GONE (home/lamp-5).` EXECUTED first, then by count; devices named for every other
    code (the members' own messages, which may quote a device, stay in results)."""
    total = len(results)
    ordered = sorted(codes.items(), key=lambda i: (i[0] != "EXECUTED", -i[1], i[0]))
    parts = []
    for code, count in ordered:
        if code == "EXECUTED":
            parts.append(f"{count} of {total} EXECUTED")
            continue
        named = [str(r["device_id"]) for r in results if r["code"] == code]
        more = f" and {len(named) - MAX_NAMED} more" if len(named) > MAX_NAMED else ""
        parts.append(f"{count} {code} ({', '.join(named[:MAX_NAMED])}{more})")
    text = "; ".join(parts) + "."
    failed = sum(1 for r in results if standing(r) == "failed")
    if failed:
        text += f" Not every device succeeded: {failed} of {total} did not; each device's outcome is in results."
    elif any(standing(r) == "waiting" for r in results):
        text += " Some wait for a person or the controller: check each request_id with iot.intent_status."
    return ("Dry run, nothing was executed: " + text) if dry_run else text

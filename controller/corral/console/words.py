"""The approval page in a person's words: who asks, what the change does, and what came of it.

Kept apart from waiting.py because it is the page's vocabulary, not its list: each function turns something
the API holds (a username, an actuator and a value, a decision code) into the sentence a person reads on a
phone, while the page keeps the exact form (username, `locked = false`, DENIED_BY_APPROVER) beside it.

Two kinds of words meet here and must not be confused. Corral's own sentences ("Denied by alice", "Really
approve?") are fixed text around values. The contract's words (the actuator's name and description, what a
value means) are the device's: a device type's author wrote them, so they are made safe (contract.text),
cut, and the page shows them marked as the device's own, never as Corral's judgement.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from corral.api.codes import PEOPLE_NAMESPACE
from corral.contract.text import written_text
from corral.decide.approvals import SERVICE_ACCOUNT_PREFIX

LABEL_TEXT: Final = 64  # the contract's own limit for names (contract.model.Label)
DESCRIPTION_TEXT: Final = 512  # and for descriptions
HIGH_RISKS: Final = frozenset(("high", "critical"))  # a second click before such an approval is sent


# Identities ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Who:
    """An identity as a person reads it: `name` ("alice", "agent in home"), what it is, and the exact username."""

    name: str
    kind: Literal["person", "agent", "system"]
    username: str


def who(username: str, people_namespace: str = PEOPLE_NAMESPACE) -> Who:
    """People by their name, agents (ServiceAccounts outside the people namespace: programs) by their name and
    namespace, Kubernetes' own identities as they are. The same split decide.approvals makes for who may approve."""
    username = written_text(username, 253)
    if username.startswith(SERVICE_ACCOUNT_PREFIX):
        namespace, _, name = username[len(SERVICE_ACCOUNT_PREFIX):].partition(":")
        if name and namespace == people_namespace:
            return Who(name, "person", username)
        if name and namespace:
            return Who(f"{name} in {namespace}", "agent", username)
    if username.startswith("system:") or not username:
        return Who(username or "someone unnamed", "system", username)
    return Who(username, "person", username)


# The contract's words for a change --------------------------------------------------------------------------


@dataclass(frozen=True)
class Said:
    """What the device's contract says about one actuator (all of it the device's words, made safe)."""

    device_kind: str  # the contract's product name, e.g. "Door lock"
    actuator: str  # the actuator's name, e.g. "Bolt"
    about: str  # its description, e.g. "true = bolt thrown (locked), false = unlocked. Unlocking lets anyone in."
    type: str  # bool, enum, number, counter, color, ...
    unit: str


def said_of(contract: Mapping[str, Any] | None, actuator_id: str) -> Said | None:
    """The contract's words for this actuator (contract: a Capability's spec as the API server returns it);
    None when the contract is unknown or has no such actuator."""
    if not contract:
        return None
    for actuator in contract.get("actuators") or []:
        if isinstance(actuator, Mapping) and actuator.get("id") == actuator_id:
            return Said(device_kind=written_text(contract.get("name"), LABEL_TEXT),
                        actuator=written_text(actuator.get("name"), LABEL_TEXT) or actuator_id,
                        about=written_text(actuator.get("description"), DESCRIPTION_TEXT),
                        type=written_text(actuator.get("type"), 16), unit=written_text(actuator.get("unit"), 16))
    return None


def _bool_words(about: str, value: bool) -> str:
    """What a description says a boolean means, when it says so in one of the two ways the catalog writes it:
    "true = bolt thrown (locked), false = unlocked" or "Light on (true) or off (false)"; "" otherwise."""
    word = "true" if value else "false"
    found = re.search(rf"\b{word}\s*=\s*([^,;.:=]+)", about, re.IGNORECASE)
    if found is None:
        found = re.search(rf"(\w[\w'-]*)\s*\(\s*{word}\s*\)", about, re.IGNORECASE)
    return found.group(1).strip()[:LABEL_TEXT] if found else ""


def value_words(said: Said | None, value: Any) -> str:
    """The value as the contract words it: "unlocked", "high", "21.5 °C"; the JSON value when it has no words."""
    plain = json.dumps(value, ensure_ascii=False)
    if said is None:
        return plain
    if isinstance(value, bool):
        return _bool_words(said.about, value) or plain
    if isinstance(value, str):
        return written_text(value, LABEL_TEXT)  # an enum value or a colour: words of their own
    if isinstance(value, int | float) and said.unit:
        return f"{plain} {said.unit}"
    return plain


def change_words(said: Said | None, value: Any) -> str:
    """The change in the contract's words ("Bolt → unlocked"); "" when the contract is unknown."""
    return f"{said.actuator} → {value_words(said, value)}" if said is not None else ""


def hold_duration(seconds: float | None) -> str:
    """How long a timed hold lasts, as a person reads it: "8 s", "20 min", "1 h 30 min"; "" without a hold."""
    if seconds is None:
        return ""
    if seconds < 120:
        return f"{seconds:g} s"
    hours, minutes = divmod(round(seconds / 60), 60)
    return " ".join(part for part in (f"{hours} h" if hours else "", f"{minutes} min" if minutes else "") if part)


@dataclass(frozen=True)
class Hold:
    """A timed hold as asked: how long, and what is put back after it (`then`; absent: the value from before)."""

    seconds: float
    then: Any = None
    has_then: bool = False


def then_words(said: Said | None, hold: Hold | None) -> str:
    """What a hold puts back, in the contract's words ("Bolt → unlocked"); "" without `then` or a contract."""
    return change_words(said, hold.then) if hold is not None and hold.has_then else ""


def hold_text(actuator: str, hold: Hold | None) -> str:
    """The hold's exact form, the way the change is written: "locked = false after 8 s"; "" without a hold."""
    if hold is None:
        return ""
    then = written_text(json.dumps(hold.then, ensure_ascii=False), LABEL_TEXT)
    back = f"{actuator} = {then}" if hold.has_then else "the value from before"
    return f"{back} after {hold_duration(hold.seconds)}"


def confirmation(risk: str, title: str, said: Said | None, actuator: str, value: Any,
                 hold: Hold | None = None) -> str:
    """The question a high- or critical-risk approval asks before it is sent; "" for lower risks. A hold's `then`
    is part of what is approved, so the question names it too."""
    if risk not in HIGH_RISKS:
        return ""
    what = (f"{said.actuator} to “{value_words(said, value)}”" if said is not None
            else f"{actuator} to {json.dumps(value, ensure_ascii=False)}")
    if hold is not None:
        back = (f"“{value_words(said, hold.then)}”" if said is not None and hold.has_then
                else json.dumps(hold.then, ensure_ascii=False) if hold.has_then else "the value from before")
        what += f", then to {back} after {hold_duration(hold.seconds)},"
    return f"Really set {what} on {title}? This is {risk} risk."


# Outcomes ------------------------------------------------------------------------------------------------------

_DENIED_BY: Final = re.compile(r"^Denied by (?P<who>\S+?)(?:: (?P<why>.*))?\.$")

# One sentence for each code that needs no more than the code to say (the controller's message, with the
# details, stays on the page beside it).
_SENTENCES: Final[dict[str, str]] = {
    "AWAITING_APPROVAL": "Waiting for a person to approve or deny it.",
    "PENDING": "Being checked; nothing has been done yet.",
    "DEDUP": "Nothing more to do: an earlier identical request already did it.",
    "DENY_ID_CONFLICT": "Refused: an earlier, different request has the same name.",
    "DENY_UNKNOWN_ACTION": "Refused: the device has no such action.",
    "DENY_ARGUMENTS": "Refused: the device does not accept that value.",
    "DENY_SCOPE": "Refused: whoever asked may not do this.",
    "DENY_SENSOR": "Refused: the readings it cited were missing or too old.",
    "DENY_INTERLOCK": "Refused by a safety rule (an interlock) that spans devices.",
    "DENY_LEASED": "Refused: someone else holds the device for now (a lease).",
    "DENY_PAUSED": "Refused: agents are paused.",
    "DENY_CONTRACT_HOLD": "Refused: the device's contract changed and waits for a person to accept it.",
    "DENY_APPROVAL": "Not done: nobody approved it in time.",
    "CANCELLED": "Not done: whoever asked withdrew it.",
    "RATE_LIMITED": "Refused: whoever asked has asked too often; it may ask again later.",
    "DEVICE_GONE": "Not done: the device is offline or gone; nothing was sent.",
    "TIMEOUT": "The device did not answer in time: it may or may not have done it.",
    "FAILED": "Not done: it failed on the way to the device, or the device refused.",
}


def outcome_words(code: str, phase: str, message: str, said: Said | None, value: Any,
                  after: Mapping[str, Any] | None, actuator: str, device_error: str = "",
                  people_namespace: str = PEOPLE_NAMESPACE) -> str:
    """What came of an Intent, in a sentence ("Done: Bolt → locked.", "Denied by alice: not now."); the code
    stays beside it on the page."""
    dry = "Dry run, nothing was done. Asked for real: " if phase == "DryRun" else ""
    if code == "EXECUTED":
        if dry:
            return f"{dry}done."
        now = after[actuator] if after is not None and actuator in after else value
        return (f"Done: {change_words(said, now)}." if said is not None
                else f"Done: {actuator} = {value_words(None, now)}.")
    if code == "DENIED_BY_APPROVER":
        found = _DENIED_BY.match(message)
        if found is None:
            return "Denied by a person."
        why = f": {found['why']}" if found["why"] else ""
        return f"Denied by {who(found['who'], people_namespace).name}{why}."
    sentence = _SENTENCES.get(code, f"Ended with {code}." if code else "Unknown.")
    if code == "AWAITING_APPROVAL" and dry:
        return f"{dry}waiting for a person's approval."
    if device_error:
        sentence += f" The device said: “{written_text(device_error, DESCRIPTION_TEXT)}”."
    return dry + sentence

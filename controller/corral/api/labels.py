"""Corral's own label domain, `corral.dev/`: labels the controller and Corral's tools write, never a person's choice.

What guards or covers a Device (an Interlock, an ApprovalGrant) must not select it by such a label. Some of them an
agent moves without any approval (the location, from `iot.set_location`, needs only `annotate`); the others follow
from what the controller decides or a device announces. An Interlock on `corral.dev/location: nursery` stopped
guarding the nursery heater the moment an agent called it "Garage" (issue 41, finding 1).

Where each known one is written:
- `corral.dev/location` (api/locations.py, reconcile/locations.py): from the overlay's free-text location;
- `corral.dev/shard` (reconcile/shardlabels.py): the shard the controller assigns a Device to;
- `corral.dev/rule` (api/rule.py, reconcile/rules/acting.py): on the Intents a Rule makes;
- `corral.dev/discovered` (client/bridge.py): on a bridged Device, the candidate it was accepted from;
- `corral.dev/device-type` (client/bridge.py, client/enroll.py): the source kind of a bridged Device, the type on
  a device credential;
- `corral.dev/device-id` (client/enroll.py): the hardware id on a device credential.
The whole prefix is refused, so a label added later is refused too without anyone remembering this list.

The API server refuses such a selector (a CEL rule on `LabelSelector`, generated from `selector_rules`) and the
models refuse it when a client builds one. Objects stored before the rule existed keep it (CRD validation does not
run again on them, and ratcheting lets an update that leaves the selector alone pass), so the controller fails
closed on them: it reads an Interlock as stored (`READ_STORED`) and it then guards every Device of its namespace
and forbids (decide/interlocks.py); a grant's model refuses it on reading, so it covers nothing, and
decide/grants.py would refuse it too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from pydantic.json_schema import JsonValue

from corral.api.locations import LOCATION_LABEL

DERIVED_PREFIX: Final = "corral.dev/"
# Why each known label may not decide what guards or covers a Device.
DERIVED_LABELS: Final[dict[str, str]] = {
    LOCATION_LABEL: "is derived from the overlay location, which an agent may change with iot.set_location",
    "corral.dev/shard": "is the shard the controller assigns a Device to, and changes when the fleet is resharded",
    "corral.dev/rule": "is written by the controller on the Intents a Rule makes",
    "corral.dev/discovered": "is derived from what a bridged device announced about itself",
    "corral.dev/device-type": "is written by corral from what a device or its bridge source announces",
    "corral.dev/device-id": "is written by corral from the hardware id a device enrolls with",
}
OTHER_DERIVED: Final = "is in the corral.dev/ label domain, which Corral and its tools write"
ALLOWED: Final = ("so it may not decide what guards or covers a Device; name the Devices (devices) or select them by "
                  "a label only people set (e.g. room: nursery)")

# Validation context under which the models read an object the API server already holds: one stored before the rule
# was read, not refused, so that the controller can fail closed on it instead of ignoring it.
READ_STORED: Final[dict[str, Any]] = {"corral.dev/stored": True}


def is_derived(key: str) -> bool:
    return key.startswith(DERIVED_PREFIX)


def derived(keys: Iterable[str]) -> list[str]:
    """The keys of Corral's own label domain, in the order given, each once."""
    return list(dict.fromkeys(key for key in keys if is_derived(key)))


def refusal(key: str) -> str:
    """Why a selector may not use `key`, and what to do instead: `KEY is ..., so ...; select ...`."""
    return f"{key} {DERIVED_LABELS.get(key, OTHER_DERIVED)}, {ALLOWED}"


def read_stored(context: object) -> bool:
    """Whether a model is being read as the API server stored it (see READ_STORED)."""
    return isinstance(context, dict) and context.get("corral.dev/stored") is True


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def selector_rules() -> list[JsonValue]:
    """The CRD rules (x-kubernetes-validations) of a LabelSelector that guards or covers Devices: one per known label,
    whose message names it and says why, and one for the rest of the domain. Static messages: the API server cannot
    bound the length of a matchLabels key (a schema has no propertyNames), so a message built from one is refused as
    too costly to estimate."""
    rules: list[JsonValue] = []
    for label in DERIVED_LABELS:
        name = _literal(label)
        rules.append({"rule": f"!(has(self.matchLabels) && {name} in self.matchLabels) && !(has(self.matchExpressions) "
                              f"&& self.matchExpressions.exists(r, r.key == {name}))",
                      "message": f"the selector key {refusal(label)}"})
    known = "{" + ", ".join(f"{_literal(label)}: true" for label in DERIVED_LABELS) + "}"
    prefix = _literal(DERIVED_PREFIX)
    rules.append({
        "rule": f"(!has(self.matchLabels) || self.matchLabels.all(k, !k.startsWith({prefix}) || k in {known})) && "
                f"(!has(self.matchExpressions) || self.matchExpressions.all(r, !r.key.startsWith({prefix}) || "
                f"r.key in {known}))",
        "message": f"a selector key {OTHER_DERIVED}, {ALLOWED}"})
    return rules

"""A Device's location as a label: `corral.dev/location`, made from the overlay's free-text location.

People (or `iot.set_location`) write `spec.overlay.location` as they like ("Utility room", "Küche, by the
door"); a label selector needs one exact, Kubernetes-legal value. The controller keeps the label in step with the
overlay on every Device, so `kubectl get devices -l corral.dev/location=utility-room` and the gateway's
`iot.control {selector: {location: "Utility room"}}` pick the same devices: both go through `location_label`.

The normalization, in order:
1. Unicode compatibility decomposition (NFKD) with the accents dropped and case folded: "Küche" -> "kuche",
   "Straße" -> "strasse", "ＫＩＴＣＨＥＮ" -> "kitchen".
2. Every run of characters other than a-z, 0-9 and "." becomes one "-": "Kitchen, above the sink" ->
   "kitchen-above-the-sink". Leading and trailing "-" and "." are dropped.
3. At most 63 characters (a label value's limit), cut at the end, then trimmed again.
4. A location with letters or digits but none in a-z/0-9 (another script: "厨房") becomes "loc-" and the first 10
   hex digits of the SHA-256 of its case-folded text, so it is still selectable (give the same text to the
   selector, or the label value itself). Letters of another script beside Latin ones are dropped: "Kitchen 厨房" is
   "kitchen".
5. Nothing left (an empty location, or only punctuation and symbols): no label.

Normalizing a label value again gives the same value, so a selector may name either the text or the label.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Mapping
from typing import Final

LOCATION_LABEL: Final = "corral.dev/location"
# Owns only this label, so no other writer's apply (the shard label's, a person's) takes it away or conflicts.
LOCATIONS_MANAGER: Final = "corral-locations"
LABEL_VALUE_LIMIT: Final = 63

_OUTSIDE = re.compile(r"[^a-z0-9.]+")
_LABEL_VALUE = re.compile(r"^(([a-z0-9][-a-z0-9.]*)?[a-z0-9])?$")


def location_label(location: str | None) -> str | None:
    """The `corral.dev/location` value for an overlay location; None when it gives no label (see the module)."""
    text = (location or "").strip()
    if not text:
        return None
    decomposed = unicodedata.normalize("NFKD", text)
    folded = "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()
    # casefold may compose again ("ß" -> "ss" is plain, but some folds yield combining marks): decompose once more.
    folded = "".join(c for c in unicodedata.normalize("NFKD", folded) if not unicodedata.combining(c))
    slug = _OUTSIDE.sub("-", folded).strip("-.")
    slug = slug[:LABEL_VALUE_LIMIT].rstrip("-.")
    if slug:
        return slug
    if any(c.isalnum() for c in text):
        return "loc-" + hashlib.sha256(unicodedata.normalize("NFC", text).casefold().encode()).hexdigest()[:10]
    return None


def is_label_value(value: str) -> bool:
    """Whether `value` is a label value `location_label` could have made (lower case, at most 63 characters)."""
    return len(value) <= LABEL_VALUE_LIMIT and bool(_LABEL_VALUE.fullmatch(value))


def location_out_of_step(labels: Mapping[str, str] | None, location: str | None) -> bool:
    """Whether a Device's location label differs from what its overlay location says it should be (missing,
    different, or present while the overlay gives none)."""
    return (labels or {}).get(LOCATION_LABEL) != location_label(location)

"""Device-supplied text, made safe once at the edge: what people and agents read is what the text shows.

A device's contract and its ack errors reach tool descriptions, Events, the dashboard and from there LLM
prompts. Text that renders differently from what it says is an attack on the reader: bidirectional
overrides reorder what is shown (a "Trojan Source" label), zero-width and tag characters carry
instructions nobody sees, variation selectors smuggle bytes, and a line break starts a new line of an
Event note or a prompt that looks like the system's own. So every piece of device text is:

- normalized to NFC (one spelling for one string: comparisons and hashes agree with what is seen);
- stripped of characters that render as nothing: format characters (Unicode category Cf: bidi
  controls, zero-width space/joiners, word joiner, BOM, the tag block U+E0000-E007F), variation
  selectors, invisible fillers, private-use, surrogate and unassigned code points, and controls;
- made single-line: line and paragraph breaks, tabs and every other space become one plain space, runs of
  spaces one, and the ends are trimmed.

Length limits stay with the fields (a contract label that is too long is refused, an ack's error is
cut). Identifiers and enum values are not text: they keep their strict ASCII patterns (contract.model).
"""

from __future__ import annotations

import json
import re
import unicodedata

_SPACES = re.compile(r" {2,}")
_INVISIBLE_EXTRA = frozenset((
    0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180B, 0x180C, 0x180D, 0x180F, 0x3164, 0xFFA0,
    *range(0xFE00, 0xFE10),  # variation selectors 1-16
    *range(0xE0100, 0xE01F0),  # variation selectors 17-256
))
_DROPPED_CATEGORIES = frozenset(("Cf", "Co", "Cs", "Cn"))
_AS_SPACE_CATEGORIES = frozenset(("Zs", "Zl", "Zp"))
ELLIPSIS = "…"


def _cleaned(char: str) -> str:
    code = ord(char)
    if char == " " or (code < 0x7F and char.isprintable()):
        return char
    category = unicodedata.category(char)
    if category in _AS_SPACE_CATEGORIES or char in "\t\n\r\v\f\x1c\x1d\x1e\x1f\x85":
        return " "
    if category == "Cc" or category in _DROPPED_CATEGORIES or code in _INVISIBLE_EXTRA:
        return ""
    return char


def safe_text(text: str) -> str:
    """The text as a reader should get it: NFC, nothing invisible, one line (see the module)."""
    if text.isascii() and text.isprintable():
        return text.strip() if "  " not in text else _SPACES.sub(" ", text).strip()
    cleaned = "".join(_cleaned(c) for c in unicodedata.normalize("NFC", text))
    # Dropping a character can leave a decomposed pair behind (e + ZWJ + combining acute): normalize again.
    return _SPACES.sub(" ", unicodedata.normalize("NFC", cleaned)).strip()


def bounded(text: str, limit: int) -> str:
    """safe_text, cut to at most `limit` characters (ending in an ellipsis when cut)."""
    text = safe_text(text)
    return text if len(text) <= limit else text[: limit - 1].rstrip() + ELLIPSIS


def safe_or_keep(value: object) -> object:
    """For a pydantic BeforeValidator: strings made safe, anything else left for the type check to refuse."""
    return safe_text(value) if isinstance(value, str) else value


def quoted_data(text: str, limit: int) -> str:
    """Someone else's text inside a sentence of ours: bounded, then in JSON double quotes, so where it starts and
    ends is plain and a quote inside it cannot end it early."""
    return json.dumps(bounded(text, limit), ensure_ascii=False)


def safe_data(value: object, limit: int) -> object:
    """`value` (JSON-like: dicts, lists, scalars) with every string in it, keys too, made safe and cut to `limit`;
    for text headed to a model's context as data."""
    if isinstance(value, str):
        return bounded(value, limit)
    if isinstance(value, dict):
        return {bounded(str(k), limit): safe_data(v, limit) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [safe_data(v, limit) for v in value]
    return value


# What a person or an agent writes into an object (an Intent's, Approval's or grant's reason, a pause's reason, a
# lease's) is read by other people and agents: an approver deciding, an agent told why it was refused. It gets
# the same treatment as device text wherever it is read, and one length limit for a sentence.
REASON_LIMIT = 512


def written_text(value: object, limit: int = REASON_LIMIT) -> str:
    """Text someone wrote, as readers should get it: safe_text, cut to `limit`; anything that is not a string
    (a field missing or of another type) is empty."""
    return bounded(value, limit) if isinstance(value, str) else ""

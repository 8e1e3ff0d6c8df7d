"""The safe subset of Home Assistant templates the bridge evaluates. Pure: no Jinja, no eval.

Templates in discovery configurations are Jinja written by the device (value_template, command_template, the
template light's command_on_template, ...). Rendering device-supplied Jinja would hand the device a language;
the bridge instead reads a small, documented subset with a parser of its own and refuses everything else with a
sentence that names the template, so that the mapping leaves that component (or that feature) out.

Value templates (extracting a value from a state payload): the whole template is one expression,
    {{ value }}            the payload as text
    {{ value_json }}       the payload parsed as JSON
    {{ value_json.a.b }}   {{ value_json['a'] }}   {{ value_json["a"]["b"] }}   {{ value_json.color[0] }}
followed by at most four filters from FILTERS: `int`, `float`, `round` / `round(n)` (0 <= n <= 10), `lower`,
`upper`, `string`, `trim`. A path step is a key (an identifier or a quoted string without backslashes) or a list
index (a non-negative integer); `.key` is always the item `key`, never a Python attribute.

Command templates (building a command payload): literal text with placeholders `{{ name }}` or
`{{ name | filter ... }}` (same filters) for the variables the caller allows (`value` by default; the template
light's `state`, `brightness`, `color_temp`, ...), and sections `{% if a is defined [and b is defined ...] %}
... {% endif %}` (not nested, no else), as Home Assistant documents for the template light. Jinja's whitespace
control (`{{-`, `-}}`, `{%-`, `-%}`) is honoured. The result is stripped of surrounding whitespace, as Home
Assistant strips a rendered template.

Not allowed: other names, function or method calls, other filters, filter arguments (but round's precision),
tests other than `is defined` in a section, `if` expressions, arithmetic, comparisons, `{% %}` tags other
than the sections, comments `{# #}`, backslashes in strings. Sizes are bounded (MAX_VALUE_TEMPLATE,
MAX_COMMAND_TEMPLATE), and the parser is a single pass over the text: no backtracking.

Values differ from Jinja's in one documented way: extraction returns the JSON value itself (an int stays an int),
where Home Assistant renders it to text first; `as_text` gives Jinja's text of a value when that is wanted.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

MAX_VALUE_TEMPLATE = 256
MAX_COMMAND_TEMPLATE = 2048
MAX_PATH = 10
MAX_FILTERS = 4
MAX_SECTIONS = 16
MAX_PLACEHOLDERS = 32
MAX_NUMBER_TEXT = 64  # a number written longer than this is not a reading (and int("9"*4300) is slow)
MAX_ROUND_DIGITS = 10
MAX_PAYLOAD = 64 * 1024  # a state payload longer than this is not parsed

FILTERS: tuple[str, ...] = ("int", "float", "round", "lower", "upper", "string", "trim")
VALUE_NAMES: tuple[str, ...] = ("value", "value_json")

SUBSET = ("value extraction ({{ value }}, {{ value_json.key }}, {{ value_json['key'] }}, {{ value_json.list[0] }}) "
          "with the filters " + ", ".join(FILTERS))


@dataclass(frozen=True)
class Refusal:
    """A template the bridge does not evaluate, and why: `reason` is a sentence naming the template."""

    template: str
    reason: str

    def __str__(self) -> str:
        return self.reason


class ExtractError(ValueError):
    """A payload that a valid value template cannot read (not JSON, a missing key, not a number, ...)."""


class RenderError(ValueError):
    """A command template rendered without a variable it needs, or with a value its filters cannot take."""


@dataclass(frozen=True)
class Filter:
    name: str  # one of FILTERS
    digits: int = 0  # round's precision


Step: TypeAlias = str | int  # a key, or a list index


@dataclass(frozen=True)
class ValueTemplate:
    """A value template in the safe subset: where the value is in the payload, and the filters applied to it."""

    text: str
    source: Literal["value", "value_json"]
    path: tuple[Step, ...] = ()
    filters: tuple[Filter, ...] = ()

    def extract(self, payload: str) -> object:
        """The value this template reads from a state payload; ExtractError when it cannot."""
        if len(payload) > MAX_PAYLOAD:
            raise ExtractError(f"the payload is longer than {MAX_PAYLOAD} characters")
        value: object = payload
        if self.source == "value_json":
            value = parse_json(payload)
            for step in self.path:
                value = _step(value, step)
        for f in self.filters:
            value = _apply(f, value, ExtractError)
        return _in_range(value, ExtractError)


@dataclass(frozen=True)
class Literal_:
    text: str


@dataclass(frozen=True)
class Placeholder:
    variable: str
    filters: tuple[Filter, ...] = ()


@dataclass(frozen=True)
class Section:
    """`{% if a is defined and ... %} parts {% endif %}`: the parts are rendered when every variable is given."""

    requires: tuple[str, ...]
    parts: tuple[Literal_ | Placeholder, ...]


Part: TypeAlias = Literal_ | Placeholder | Section


@dataclass(frozen=True)
class CommandTemplate:
    """A command template in the safe subset: literal text, placeholders and `is defined` sections."""

    text: str
    parts: tuple[Part, ...]

    @property
    def required(self) -> frozenset[str]:
        """The variables used outside any section (render needs them)."""
        return frozenset(p.variable for p in self.parts if isinstance(p, Placeholder))

    @property
    def variables(self) -> frozenset[str]:
        """Every variable the template refers to."""
        names: set[str] = set()
        for part in self.parts:
            if isinstance(part, Placeholder):
                names.add(part.variable)
            elif isinstance(part, Section):
                names.update(part.requires)
                names.update(p.variable for p in part.parts if isinstance(p, Placeholder))
        return frozenset(names)

    def render(self, value: object) -> str:
        """The payload for one value (`{{ value }}`)."""
        return self.render_with({"value": value})

    def render_with(self, values: Mapping[str, object]) -> str:
        """The payload for these variables (absent ones leave their sections out); RenderError if one the
        template needs outside a section is missing."""
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, Literal_):
                out.append(part.text)
            elif isinstance(part, Placeholder):
                out.append(_render_placeholder(part, values))
            elif all(name in values for name in part.requires):
                for inner in part.parts:
                    out.append(inner.text if isinstance(inner, Literal_) else _render_placeholder(inner, values))
        return "".join(out).strip()


def _render_placeholder(part: Placeholder, values: Mapping[str, object]) -> str:
    if part.variable not in values:
        raise RenderError(f"the command template needs a value for {part.variable!r}")
    value = values[part.variable]
    for f in part.filters:
        value = _apply(f, value, RenderError)
    return as_text(value)


# ---------------------------------------------------------------------------------------------------------------
# Values


def parse_json(payload: str) -> object:
    """The payload as JSON (no NaN or Infinity, bounded nesting); ExtractError when it is not JSON."""
    try:
        return json.loads(payload, parse_constant=_no_constant)
    except (ValueError, RecursionError) as err:
        raise ExtractError("the payload is not JSON") from err


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _step(value: object, step: Step) -> object:
    if isinstance(step, int):
        if isinstance(value, list) and step < len(value):
            return value[step]
        raise ExtractError(f"the payload has no item [{step}]")
    if isinstance(value, dict) and step in value:
        return value[step]
    raise ExtractError(f"the payload has no key {_shown(step)}")


def as_text(value: object) -> str:
    """A value as Jinja prints it (True, None, 21.5, 'text' as it is)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float) or value is None:
        return str(value)
    # A JSON object or list: Jinja prints Python's repr; so does this, for the rare template that extracts one.
    return repr(value)


def _number_text(value: object, error: type[ValueError]) -> str:
    text = as_text(value).strip() if isinstance(value, str) else ""
    if not text or len(text) > MAX_NUMBER_TEXT:
        raise error(f"{_shown(value)} is not a number")
    return text


def _in_range(value: object, error: type[ValueError]) -> object:
    # Every number the bridge goes on to use is a float somewhere (ranges, steps, confirmation): a JSON integer
    # beyond float's range (400 digits) or 1e400 (read as inf) is no value, and must not fail later, elsewhere.
    if isinstance(value, int | float) and not isinstance(value, bool):
        _to_float(value, error)
    return value


def _to_float(value: object, error: type[ValueError]) -> float:
    if isinstance(value, bool | int | float):
        try:
            result = float(value)
        except OverflowError as err:  # an int too large for a float
            raise error(f"{_shown(value)} is too large a number") from err
    else:
        try:
            result = float(_number_text(value, error))
        except ValueError as err:
            raise error(f"{_shown(value)} is not a number") from err
    if not math.isfinite(result):
        raise error(f"{_shown(value)} is not a finite number")
    return result


def _to_int(value: object, error: type[ValueError]) -> int:
    # Jinja's int: an integer as written, else the number truncated ("21.7" -> 21); Home Assistant refuses
    # what is not a number (no default given), and so does this.
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, str):
        text = _number_text(value, error)
        try:
            return int(text, 10)
        except ValueError:
            pass
    return int(_to_float(value, error))


def _apply(f: Filter, value: object, error: type[ValueError]) -> object:
    try:
        return _filtered(f, value, error)
    except ArithmeticError as err:  # any overflow left (round of a huge number): not a value, never a crash
        raise error(f"{_shown(value)} is too large a number") from err


def _filtered(f: Filter, value: object, error: type[ValueError]) -> object:
    if f.name == "int":
        return _to_int(value, error)
    if f.name == "float":
        return _to_float(value, error)
    if f.name == "round":
        # Home Assistant's round: "common" rounding of the float; precision 0 gives an int.
        number = _to_float(value, error)
        return round(number) if f.digits == 0 else round(number, f.digits)  # Python round(x) is an int
    text = as_text(value)
    if f.name == "lower":
        return text.lower()
    if f.name == "upper":
        return text.upper()
    if f.name == "trim":
        return text.strip()
    return text  # string


def _shown(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------------------------------------------------------
# Parsing


class _Refused(Exception):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


Token: TypeAlias = tuple[str, str]  # (kind, text): name, int, string, or the punctuation itself


def _tokens(expr: str) -> list[Token]:
    """The tokens of one expression or tag. Only an unterminated string or a backslash is refused here; any other
    token outside the subset is refused by the parser where it stands, so the reason names the first problem."""
    out: list[Token] = []
    i, n = 0, len(expr)
    while i < n:
        c = expr[i]
        if c in " \t\r\n":
            i += 1
        elif c.isascii() and (c.isalpha() or c == "_"):
            j = i + 1
            while j < n and expr[j].isascii() and (expr[j].isalnum() or expr[j] == "_"):
                j += 1
            out.append(("name", expr[i:j]))
            i = j
        elif c.isascii() and c.isdigit():
            j = i + 1
            while j < n and expr[j].isascii() and (expr[j].isdigit() or expr[j] in ".eE"):
                j += 1
            digits = expr[i:j]
            out.append(("int" if digits.isdigit() else "number", digits))
            i = j
        elif c in "'\"":
            j = expr.find(c, i + 1)
            if j < 0:
                raise _Refused("an unterminated string")
            text = expr[i + 1: j]
            if "\\" in text:
                raise _Refused("a backslash in a string")
            out.append(("string", text))
            i = j + 1
        elif c in ".[]|()":
            out.append((c, c))
            i += 1
        else:
            out.append(("op" if c in "+-*/%~<>=!" else "other", c))
            i += 1
    return out


class _Cursor:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.at = 0

    def peek(self) -> Token | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, kind: str) -> str:
        token = self.peek()
        if token is None or token[0] != kind:
            raise _Refused(_unexpected(token, kind))
        self.at += 1
        return token[1]

    def done(self) -> bool:
        return self.at >= len(self.tokens)


def _unexpected(token: Token | None, wanted: str) -> str:
    if token is None:
        return f"an expression that ends where {wanted!r} was expected"
    kind, text = token
    if kind == "(":
        return "parentheses or a function call"
    if kind == "op":
        return "arithmetic or a comparison"
    if kind == "number":
        return "a decimal number"
    if kind == "other":
        return ("a list, a mapping or a call with several arguments" if text in ",:{}"
                else f"the character {text!r}")
    if kind in ("int", "string"):
        return f"the literal {text[:20]!r} where {wanted!r} was expected"
    if kind == "name" and text in ("if", "else", "is", "not", "and", "or", "in"):
        return f"the keyword {text!r} (tests and conditions)"
    return f"{text!r} where {wanted!r} was expected"


def _filters(cursor: _Cursor) -> tuple[Filter, ...]:
    out: list[Filter] = []
    while not cursor.done():
        cursor.take("|")
        name = cursor.take("name")
        if name not in FILTERS:
            raise _Refused(f"the filter {name!r}")
        digits = 0
        token = cursor.peek()
        if token is not None and token[0] == "(":
            if name != "round":
                raise _Refused(f"an argument to the filter {name!r}")
            cursor.take("(")
            digits = int(cursor.take("int")[:3])
            cursor.take(")")
            if digits > MAX_ROUND_DIGITS:
                raise _Refused(f"round to more than {MAX_ROUND_DIGITS} digits")
        out.append(Filter(name, digits))
        if len(out) > MAX_FILTERS:
            raise _Refused(f"more than {MAX_FILTERS} filters")
    return tuple(out)


def _value_expression(expr: str) -> tuple[Literal["value", "value_json"], tuple[Step, ...], tuple[Filter, ...]]:
    cursor = _Cursor(_tokens(expr))
    name = cursor.take("name")
    if name not in VALUE_NAMES:
        raise _Refused(f"the name {name!r} (a value template reads only value and value_json)")
    path: list[Step] = []
    while (token := cursor.peek()) is not None and token[0] in ".[":
        if name == "value":
            raise _Refused("a path into value (only value_json has keys)")
        if token[0] == ".":
            cursor.take(".")
            nxt = cursor.peek()
            if nxt is not None and nxt[0] == "int":
                path.append(int(cursor.take("int")[:9]))
            else:
                path.append(cursor.take("name"))
        else:
            cursor.take("[")
            nxt = cursor.peek()
            if nxt is not None and nxt[0] == "int":
                path.append(int(cursor.take("int")[:9]))
            else:
                path.append(cursor.take("string"))
            cursor.take("]")
        if len(path) > MAX_PATH:
            raise _Refused(f"a path deeper than {MAX_PATH} keys")
        after = cursor.peek()
        if after is not None and after[0] == "(":
            raise _Refused(f"a method call ({str(path[-1])[:20]})")
    source: Literal["value", "value_json"] = "value_json" if name == "value_json" else "value"
    return source, tuple(path), _filters(cursor)


def _placeholder(expr: str, variables: tuple[str, ...]) -> Placeholder:
    cursor = _Cursor(_tokens(expr))
    name = cursor.take("name")
    if name not in variables:
        raise _Refused(f"the name {name!r} (this template may use {', '.join(variables)})")
    token = cursor.peek()
    if token is not None and token[0] in ".[(":
        raise _Refused("a path, attribute or call on a command variable")
    return Placeholder(name, _filters(cursor))


def _section_head(tag: str, variables: tuple[str, ...]) -> tuple[str, ...]:
    cursor = _Cursor(_tokens(tag))
    if cursor.take("name") != "if":
        raise _Refused("a {% %} tag other than `if ... is defined`")
    names: list[str] = []
    while True:
        name = cursor.take("name")
        if name not in variables:
            raise _Refused(f"the name {name!r} (this template may use {', '.join(variables)})")
        rest = cursor.tokens[cursor.at: cursor.at + 2]
        if rest != [("name", "is"), ("name", "defined")]:
            raise _Refused("a condition other than `name is defined`")
        cursor.at += 2
        names.append(name)
        if cursor.done():
            return tuple(names)
        if cursor.take("name") != "and":
            raise _Refused("a condition other than `a is defined and b is defined`")


def _refusal(text: str, what: str) -> Refusal:
    return Refusal(text, f"its template {_shown(text, 80)} uses {what}, which the bridge does not evaluate "
                         f"(it evaluates only {SUBSET})")


def compile_value(text: str) -> ValueTemplate | Refusal:
    """A value template in the safe subset, or the sentence saying why not."""
    if not isinstance(text, str):
        return Refusal(_shown(text), f"its template {_shown(text)} is not text")
    return _compile_value(text)


@functools.lru_cache(maxsize=1024)  # a device's templates are compiled again for every state message
def _compile_value(text: str) -> ValueTemplate | Refusal:
    if len(text) > MAX_VALUE_TEMPLATE:
        return Refusal(text[:80], f"its template is longer than {MAX_VALUE_TEMPLATE} characters")
    body = text.strip()
    if not (body.startswith("{{") and body.endswith("}}")) or len(body) < 4:
        return _refusal(text, "text or tags outside one {{ }} expression")
    inner = body[2:-2]
    if inner.startswith("-"):
        inner = inner[1:]
    if inner.endswith("-"):
        inner = inner[:-1]
    if "{{" in inner or "}}" in inner or "{%" in inner or "{#" in inner:
        return _refusal(text, "more than one expression, or tags")
    try:
        source, path, filters = _value_expression(inner)
    except _Refused as refused:
        return _refusal(text, refused.what)
    return ValueTemplate(text, source, path, filters)


def compile_command(text: str, variables: tuple[str, ...] = ("value",)) -> CommandTemplate | Refusal:
    """A command template in the safe subset (placeholders of these variables, `is defined` sections), or the
    sentence saying why not."""
    if not isinstance(text, str):
        return Refusal(_shown(text), f"its template {_shown(text)} is not text")
    return _compile_command(text, tuple(variables))


@functools.lru_cache(maxsize=1024)
def _compile_command(text: str, variables: tuple[str, ...]) -> CommandTemplate | Refusal:
    if len(text) > MAX_COMMAND_TEMPLATE:
        return Refusal(text[:80], f"its template is longer than {MAX_COMMAND_TEMPLATE} characters")
    try:
        return CommandTemplate(text, _command_parts(text, variables))
    except _Refused as refused:
        return _refusal(text, refused.what)


def _command_tokens(text: str) -> Iterator[tuple[str, str]]:
    """The template as ("text", literal), ("{", placeholder) and ("%", tag) tokens, Jinja's whitespace control
    (`{{-`, `-}}`) applied to the literals around them."""
    literal: list[str] = []
    strip_next = False
    i, n = 0, len(text)
    while i < n:
        start = text.find("{", i)
        if start < 0 or start + 1 >= n:
            rest = text[i:]
            literal.append(rest.lstrip() if strip_next else rest)
            break
        opener = text[start + 1]
        if opener not in "{%#":
            chunk = text[i: start + 1]
            literal.append(chunk.lstrip() if strip_next else chunk)
            strip_next = strip_next and not chunk.strip()
            i = start + 1
            continue
        chunk = text[i:start]
        literal.append(chunk.lstrip() if strip_next else chunk)
        if opener == "#":
            raise _Refused("a comment {# #}")
        end = text.find("}}" if opener == "{" else "%}", start + 2)
        if end < 0:
            raise _Refused("an unterminated {{ or {%")
        inner = text[start + 2: end]
        strip_before, strip_next = inner.startswith("-"), inner.endswith("-")
        inner = inner[1 if strip_before else 0: len(inner) - (1 if strip_next else 0)]
        chunk = "".join(literal)
        literal.clear()
        if strip_before:
            chunk = chunk.rstrip()
        if chunk:
            yield "text", chunk
        yield opener, inner
        i = end + 2
    chunk = "".join(literal)
    if chunk:
        yield "text", chunk


def _command_parts(text: str, variables: tuple[str, ...]) -> tuple[Part, ...]:
    top: list[Part] = []
    section: list[Literal_ | Placeholder] | None = None
    requires: tuple[str, ...] = ()
    sections = placeholders = 0
    for kind, content in _command_tokens(text):
        if kind == "text":
            (section if section is not None else top).append(Literal_(content))
        elif kind == "{":
            placeholders += 1
            if placeholders > MAX_PLACEHOLDERS:
                raise _Refused(f"more than {MAX_PLACEHOLDERS} placeholders")
            (section if section is not None else top).append(_placeholder(content, variables))
        else:
            words = content.split()
            if words == ["endif"]:
                if section is None:
                    raise _Refused("an endif without an if")
                top.append(Section(requires, tuple(section)))
                section = None
            elif words and words[0] == "if":
                if section is not None:
                    raise _Refused("a nested if")
                sections += 1
                if sections > MAX_SECTIONS:
                    raise _Refused(f"more than {MAX_SECTIONS} sections")
                requires = _section_head(content, variables)
                section = []
            else:
                raise _Refused(f"the tag {{% {' '.join(words[:1])} %}}" if words else "an empty tag")
    if section is not None:
        raise _Refused("an if without an endif")
    return tuple(top)

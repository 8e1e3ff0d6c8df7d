"""The safe template subset (bridge/templates.py): what it evaluates, what it refuses, and that nothing crashes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.bridge.templates import (
    CommandTemplate,
    ExtractError,
    Refusal,
    RenderError,
    ValueTemplate,
    as_text,
    compile_command,
    compile_value,
)


def value(text: str) -> ValueTemplate:
    compiled = compile_value(text)
    assert isinstance(compiled, ValueTemplate), compiled
    return compiled


def command(text: str, variables: tuple[str, ...] = ("value",)) -> CommandTemplate:
    compiled = compile_command(text, variables)
    assert isinstance(compiled, CommandTemplate), compiled
    return compiled


@pytest.mark.parametrize(("template", "payload", "expected"), [
    ("{{ value }}", "ON", "ON"),
    ("{{value}}", " 21.5 ", " 21.5 "),
    ("{{ value_json }}", '{"a": 1}', {"a": 1}),
    ("{{ value_json.temperature }}", '{"temperature": 21.5}', 21.5),
    ("{{ value_json.temperature}}", '{"temperature": 21.5}', 21.5),  # HA's device-discovery example spacing
    ("{{ value_json.a.b }}", '{"a": {"b": "x"}}', "x"),
    ("{{ value_json['a'] }}", '{"a": 3}', 3),
    ('{{ value_json["a"]["b c"] }}', '{"a": {"b c": true}}', True),
    ("{{ value_json.color[0] }}", '{"color": [255, 10, 0]}', 255),
    ("{{ value_json.color.1 }}", '{"color": [255, 10, 0]}', 10),
    ("{{ value_json.values }}", '{"values": 4}', 4),  # a key, never the dict's method
    ("{{ value | int }}", "42", 42),
    ("{{ value | int }}", "21.7", 21),  # Jinja's int: the number truncated
    ("{{ value_json.t | float }}", '{"t": "21.5"}', 21.5),
    ("{{ value_json.t | round(1) }}", '{"t": 21.46}', 21.5),
    ("{{ value_json.t | round }}", '{"t": 21.6}', 22),
    ("{{ value_json.t|float|round(2) }}", '{"t": "3.14159"}', 3.14),
    ("{{ value_json.state | lower }}", '{"state": "ON"}', "on"),
    ("{{ value | upper }}", "on", "ON"),
    ("{{ value_json.n | string }}", '{"n": 5}', "5"),
    ("{{ value | trim }}", "  on ", "on"),
    ("{{- value_json.state -}}", '{"state": "OFF"}', "OFF"),
    ("  {{ value_json.state }}\n", '{"state": "OFF"}', "OFF"),
])
def test_value_templates_extract(template: str, payload: str, expected: object) -> None:
    result = value(template).extract(payload)
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize(("template", "payload"), [
    ("{{ value_json.a }}", "not json"),
    ("{{ value_json.a }}", '{"b": 1}'),
    ("{{ value_json.a.b }}", '{"a": 1}'),
    ("{{ value_json[2] }}", "[1]"),
    ("{{ value_json[0] }}", '{"0": 1}'),
    ("{{ value | int }}", "on"),
    ("{{ value | float }}", "nan"),
    ("{{ value | float }}", "1e999"),
    ("{{ value_json.a | int }}", '{"a": null}'),
    ("{{ value | int }}", "9" * 100),
    ("{{ value_json }}", "NaN"),
    ("{{ value_json }}", "[" * 100_000),
])
def test_value_extraction_fails_with_a_reason(template: str, payload: str) -> None:
    with pytest.raises(ExtractError):
        value(template).extract(payload)


@pytest.mark.parametrize(("template", "named"), [
    ("{{ value.split(',')[0] }}", "path into value"),
    ("{{ value_json.a.split(',') }}", "method call"),
    ("{{ value_json.ison and value_json.mode == 'white' }}", "keyword 'and'"),
    ("{{ value_json.mode == 'white' }}", "comparison"),
    ("{% if value_json.ison %}on{% else %}off{% endif %}", "outside one"),
    ("{{ value_json.brightness | float | multiply(2.55) | round(0) }}", "filter 'multiply'"),
    ("{{ (1000000 / value_json.temp | float) | round(0) }}", "parentheses"),
    ("{{ 1000000 / value_json.temp }}", "literal '1000000'"),
    ("{{ value | tojson }}", "filter 'tojson'"),
    ("{{ value | int(0) }}", "argument to the filter 'int'"),
    ("{{ value_json.a if value_json.b else 1 }}", "'if'"),
    ("{{ value_json.a is defined }}", "'is'"),
    ("{{ states('sensor.x') }}", "name 'states'"),
    ("{{ now() }}", "name 'now'"),
    ("{{ value_json.__class__ }}", ""),  # only a key, but fine: it names no attribute either way
    ("{{ value }} W", "outside one"),
    ("{{ value }}{{ value }}", "more than one"),
    ("{# comment #}{{ value }}", "outside one"),
    ("{{ value_json['a\\'b'] }}", "backslash"),
    ("{{ value_json[-1] }}", "arithmetic"),
    ("{{ value | round(99) }}", "more than 10 digits"),
    ("{{ value | lower | lower | lower | lower | lower }}", "more than 4 filters"),
    ("{{ value_json.a.b.c.d.e.f.g.h.i.j.k }}", "deeper than 10"),
    ("{{ value_json.1.5 }}", "decimal"),
    ("value", "outside one"),
    ("", "outside one"),
])
def test_value_templates_beyond_the_subset_are_refused(template: str, named: str) -> None:
    compiled = compile_value(template)
    if template == "{{ value_json.__class__ }}":
        assert isinstance(compiled, ValueTemplate)  # a key named __class__: item lookup, never getattr
        assert compiled.extract('{"__class__": 1}') == 1
        return
    assert isinstance(compiled, Refusal), compiled
    assert named in compiled.reason
    assert "its template" in compiled.reason and "the bridge does not evaluate" in compiled.reason
    assert str(compiled) == compiled.reason


def test_refusals_name_the_template_and_stay_bounded() -> None:
    refused = compile_value("{{ value_json.x | multiply(2) }}")
    assert isinstance(refused, Refusal)
    assert "'{{ value_json.x | multiply(2) }}'" in refused.reason
    long = compile_value("{{ value_json." + "a" * 1000 + " }}")
    assert isinstance(long, Refusal) and "longer than 256" in long.reason and len(long.reason) < 200
    not_text = compile_value(json.loads("5"))  # discovery JSON may put a number where text belongs
    assert isinstance(not_text, Refusal)


def test_command_templates_render_values() -> None:
    assert command("{{ value }}").render(42) == "42"
    assert command('{"state": "{{ value }}"}').render("ON") == '{"state": "ON"}'
    assert command("{{ value | int }}").render(21.7) == "21"
    assert command("{{ value | round(1) }}").render(21.46) == "21.5"
    assert command("{{ value | lower }}").render("ON") == "on"
    assert command("set {{value}} now").render(True) == "set True now"  # Jinja's text of a boolean
    assert command('{"a": {"b": {{ value }}}}').render(1) == '{"a": {"b": 1}}'  # }} outside a tag is text
    assert command("  OFF  ").render(None) == "OFF"  # stripped, as Home Assistant strips a rendered template
    assert command("{").render(1) == "{"


def test_the_template_light_json_example_from_the_ha_docs() -> None:
    # Home Assistant's light.mqtt docs, template schema, "JSON payload".
    text = ('{"state": "on"\n{%- if brightness is defined -%}\n, "brightness": {{ brightness }}\n{%- endif -%}\n'
            '{%- if red is defined and green is defined and blue is defined -%}\n'
            ', "color": [{{ red }}, {{ green }}, {{ blue }}]\n{%- endif -%}\n'
            '{%- if hue is defined and sat is defined -%}\n, "huesat": [{{ hue }}, {{ sat }}]\n{%- endif -%}\n'
            '{%- if effect is defined -%}\n, "effect": "{{ effect }}"\n{%- endif -%}\n}')
    variables = ("state", "brightness", "color_temp", "red", "green", "blue", "hue", "sat", "flash",
                 "transition", "effect")
    template = command(text, variables)
    assert template.render_with({}) == '{"state": "on"}'
    assert template.render_with({"brightness": 128}) == '{"state": "on", "brightness": 128}'
    assert template.render_with({"red": 1, "green": 2, "blue": 3, "effect": "rainbow"}) == (
        '{"state": "on", "color": [1, 2, 3], "effect": "rainbow"}')
    assert template.render_with({"red": 1}) == '{"state": "on"}'  # a section needs all its variables
    assert template.required == frozenset()
    assert template.variables == {"brightness", "red", "green", "blue", "hue", "sat", "effect"}


def test_the_template_light_cct_example_is_refused() -> None:
    # Home Assistant's light.mqtt docs, template schema, "CCT light": arithmetic and filters beyond the subset.
    text = ('{"turn": "on", "mode": "white"\n{%- if brightness is defined -%}\n'
            ', "brightness": {{brightness | float | multiply(0.39215686) | round(0)}}\n{%- endif -%}\n'
            '{%- if color_temp is defined -%}\n, "temp": {{ [[(1000000 / color_temp | float) | round(0), 3000] '
            '| max, 6500] | min }}\n{%- endif -%}\n}')
    refused = compile_command(text, ("state", "brightness", "color_temp"))
    assert isinstance(refused, Refusal) and "multiply" in refused.reason


@pytest.mark.parametrize(("template", "named"), [
    ("{{ value | tojson }}", "filter 'tojson'"),
    ("{{ brightness }}", "name 'brightness'"),
    ("{{ value.x }}", "path, attribute or call"),
    ("{{ value() }}", "path, attribute or call"),
    ("{% for x in y %}{% endfor %}", "tag {% for %}"),
    ("{% if value %}1{% endif %}", "other than `name is defined`"),
    ("{% if value is defined %}{% if value is defined %}{% endif %}{% endif %}", "nested if"),
    ("{% if value is defined %}x", "without an endif"),
    ("{% endif %}", "endif without an if"),
    ("{% if value is defined or value is defined %}x{% endif %}", "`a is defined and b is defined`"),
    ("{% if value is not defined %}x{% endif %}", "other than `name is defined`"),
    ("{{ value ", "unterminated"),
    ("{# note #}{{ value }}", "comment"),
    ("{% raw %}{{ value }}{% endraw %}", "tag {% raw %}"),
    ("{{ value | d }}", "filter 'd'"),
    ("{{ value + 1 }}", "arithmetic"),
    ("{{ value ~ 'x' }}", "arithmetic"),
    ("{{ {'a': value} }}", "mapping"),
])
def test_command_templates_beyond_the_subset_are_refused(template: str, named: str) -> None:
    refused = compile_command(template)
    assert isinstance(refused, Refusal), refused
    assert named in refused.reason


def test_command_rendering_needs_its_variables() -> None:
    with pytest.raises(RenderError):
        command("{{ value }}").render_with({})
    with pytest.raises(RenderError):
        command("{{ value | int }}").render("on")
    assert command("{{ value }}").required == {"value"}


def test_as_text_is_jinjas_text() -> None:
    assert [as_text(v) for v in (True, None, 1, 2.5, "x")] == ["True", "None", "1", "2.5", "x"]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_compiles_or_is_refused(text: str) -> None:
    assert isinstance(compile_value(text), ValueTemplate | Refusal)
    compiled = compile_command(text)
    assert isinstance(compiled, CommandTemplate | Refusal)
    if isinstance(compiled, CommandTemplate):
        try:
            compiled.render_with({"value": 1})
        except RenderError:
            pass


_PIECES = st.sampled_from(["{{", "}}", "{%", "%}", "{#", "-", " ", "value", "value_json", ".", "a", "[", "]",
                           "'", '"', "0", "|", "int", "round", "(", ")", "if", "is", "defined", "and", "endif",
                           "\\", "\n", "{", "}"])


@settings(max_examples=500, deadline=None)
@given(st.lists(_PIECES, max_size=40).map("".join), st.text(max_size=60))
def test_template_shaped_text_never_crashes(text: str, payload: str) -> None:
    compiled = compile_value(text)
    if isinstance(compiled, ValueTemplate):
        try:
            compiled.extract(payload)
        except ExtractError:
            pass
    rendered = compile_command(text)
    if isinstance(rendered, CommandTemplate):
        try:
            rendered.render(payload)
        except RenderError:
            pass


def test_the_templates_of_home_assistants_documented_examples() -> None:
    # Every template in the documented examples (tests/data/bridge/ha/examples.json) either compiles or is
    # refused; these are the refused ones, and why.
    examples = json.loads((Path(__file__).parents[1] / "data/bridge/ha/examples.json").read_text())
    light_variables = ("state", "brightness", "color_temp", "red", "green", "blue", "hue", "sat", "flash",
                       "transition", "effect")
    refused = {}
    for name, entry in examples.items():
        if name.startswith("_"):
            continue
        configs = [entry["payload"], *entry["payload"].get("cmps", {}).values()]
        for config in configs:
            for key, text in config.items():
                if not key.endswith(("template", "_tpl")):
                    continue
                if "command" in key or key.startswith(("cmd_", "command_")):
                    compiled: object = compile_command(text, light_variables if "on_template" in key else ("value",))
                else:
                    compiled = compile_value(text)
                if isinstance(compiled, Refusal):
                    refused[f"{name}.{key}"] = compiled.reason
    assert set(refused) == {"cover.value_template", "lock.value_template", "lock.command_template"}
    assert "path into value" in refused["cover.value_template"]
    assert "the name 'code'" in refused["lock.command_template"]


_HUGE = "9" * 400


@pytest.mark.parametrize("template", ["{{ value_json.a }}", "{{ value_json.a | float }}", "{{ value_json.a | int }}",
                                      "{{ value_json.a | round }}", "{{ value_json.a | round(2) }}",
                                      "{{ value_json.a | string | float }}", "{{ value_json.a | int | round }}"])
@pytest.mark.parametrize("number", [_HUGE, "-" + _HUGE, "1e400", "-1e400", "1" + "0" * 309])
def test_a_number_beyond_floats_range_is_not_extracted(template: str, number: str) -> None:
    """Issue 41, finding 12: a 400-digit integer raised OverflowError past the template's errors; every overflow is
    now the documented outcome, an extraction error (no value)."""
    with pytest.raises(ExtractError, match=r"too large a number|not a finite number|is not a number"):
        value(template).extract(f'{{"a": {number}}}')


def test_numbers_at_floats_edge_still_extract() -> None:
    assert value("{{ value_json.a | float }}").extract('{"a": 1.7e308}') == 1.7e308
    assert value("{{ value_json.a }}").extract(f'{{"a": {"9" * 300}}}') == int("9" * 300)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=10 ** 300, max_value=10 ** 1000) | st.integers(max_value=-10 ** 300, min_value=-10 ** 1000),
       st.sampled_from(["", " | int", " | float", " | round", " | round(3)", " | string | float"]))
def test_huge_integers_extract_or_fail_with_an_extraction_error(number: int, filters: str) -> None:
    try:
        result = value("{{ value_json.a" + filters + " }}").extract(f'{{"a": {number}}}')
    except ExtractError:
        return
    assert isinstance(result, int | float) and math.isfinite(float(result))


def test_a_command_template_with_a_huge_value_is_a_render_error() -> None:
    with pytest.raises(RenderError, match="too large a number"):
        command("{{ value | float }}").render(int(_HUGE))

"""No storeroom classes and no long functions: the size rules of issue 29, measured by tests/sizes.py."""

from __future__ import annotations

from tests.sizes import CLASS_AREAS, CLASS_LIMIT, FUNCTION_EXEMPT, FUNCTION_LIMIT, oversized


def test_no_class_in_reconcile_or_gateway_is_over_300_lines() -> None:
    classes, _ = oversized()
    assert not classes, (f"classes over {CLASS_LIMIT} lines in {', '.join(CLASS_AREAS)}:\n"
                         + "\n".join(map(str, classes)))


def test_no_function_outside_the_cli_is_over_60_lines() -> None:
    _, functions = oversized()
    assert not functions, (f"functions over {FUNCTION_LIMIT} lines outside {', '.join(FUNCTION_EXEMPT)}/:\n"
                           + "\n".join(map(str, functions)))

"""The API group, its version and Corral's annotations are spelled once, in api/codes.py; everything else imports them."""

from __future__ import annotations

import ast
from typing import get_args

from corral.api import codes
from corral.api.base import Resource
from tests.imports import CORRAL

NAMES = {"GROUP": codes.GROUP, "API_VERSION": codes.API_VERSION, "INTENT_ANNOTATION": codes.INTENT_ANNOTATION,
         "CANCEL_ANNOTATION": codes.CANCEL_ANNOTATION, "TRACEPARENT_ANNOTATION": codes.TRACEPARENT_ANNOTATION}
# A Literal type needs the text itself: Resource.api_version spells API_VERSION twice, as its type and its default.
SPELLED_ELSEWHERE = {("api/base.py", codes.API_VERSION): 2}


def test_the_resource_api_version_type_is_the_api_version() -> None:
    field = Resource.model_fields["api_version"]
    assert get_args(field.annotation) == (codes.API_VERSION,)
    assert field.default == codes.API_VERSION == f"{codes.GROUP}/{codes.VERSION}"


def test_the_group_version_and_annotations_are_spelled_only_in_api_codes() -> None:
    values = {value: name for name, value in NAMES.items()}
    spelled: dict[tuple[str, str], int] = {}
    for path in sorted(CORRAL.rglob("*.py")):
        where = str(path.relative_to(CORRAL))
        if where == "api/codes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in values:
                spelled[where, node.value] = spelled.get((where, node.value), 0) + 1
    wrong = {f"{where}: {values[value]} ({value!r}) x{count}" for (where, value), count in spelled.items()
             if SPELLED_ELSEWHERE.get((where, value)) != count}
    assert not wrong, "import these names from corral.api.codes instead:\n" + "\n".join(sorted(wrong))

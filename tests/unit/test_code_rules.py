"""Rules of the codebase that no linter checks for us."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IGNORE = re.compile(r"#\s*type:\s*ignore(?P<code>\[[a-z-, ]+\])?(?P<rest>.*)$")


def test_every_type_ignore_names_its_error_and_says_why_on_the_same_line() -> None:
    unexplained = []
    for path in sorted((REPO / "controller").rglob("*.py")) + sorted((REPO / "firmware").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found = IGNORE.search(line)
            if found and not (found["code"] and re.match(r"\s*#\s*\S", found["rest"])):
                unexplained.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not unexplained, "type: ignore needs [code] and '# why' after it:\n" + "\n".join(unexplained)


def test_tests_carry_no_type_ignores_since_mypy_does_not_check_them() -> None:
    found = [f"{path.relative_to(REPO)}:{number}" for path in sorted((REPO / "tests").rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if IGNORE.search(line)
             and path.name != "test_code_rules.py"]
    assert not found, found

"""The size of every class and function in controller/corral, in lines, for the size rules (tests/unit/test_sizes.py).

A class over 300 lines in reconcile/ or gateway/ is a storeroom, not a controller or a tool; a function over 60 lines
anywhere is several steps that want names. The CLI's functions are exempt: a click command is one long declaration
of its options. `python tests/sizes.py` prints the largest classes and every function over the limit. Reads source
files only.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORRAL = REPO / "controller" / "corral"
CLASS_LIMIT = 300
CLASS_AREAS = ("reconcile", "gateway")
FUNCTION_LIMIT = 60
FUNCTION_EXEMPT = ("cli",)


@dataclass(frozen=True, order=True)
class Size:
    lines: int
    where: str  # corral/gateway/server.py:40 Gateway

    def __str__(self) -> str:
        return f"{self.lines:5} lines  {self.where}"


def sizes(root: Path = CORRAL) -> tuple[list[Size], list[Size]]:
    """Classes and functions (methods and nested ones included), largest first."""
    classes, functions = [], []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root.parent)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                size = Size(_lines(node), f"{name}:{node.lineno} {node.name}")
                (classes if isinstance(node, ast.ClassDef) else functions).append(size)
    return sorted(classes, reverse=True), sorted(functions, reverse=True)


def _lines(node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1  # from `def`/`class` to the last line, decorators left out


def in_area(size: Size, areas: tuple[str, ...]) -> bool:
    return size.where.split("/")[1] in areas


def oversized(root: Path = CORRAL) -> tuple[list[Size], list[Size]]:
    """Classes in reconcile/ or gateway/ over CLASS_LIMIT, functions outside cli/ over FUNCTION_LIMIT."""
    classes, functions = sizes(root)
    return ([c for c in classes if c.lines > CLASS_LIMIT and in_area(c, CLASS_AREAS)],
            [f for f in functions if f.lines > FUNCTION_LIMIT and not in_area(f, FUNCTION_EXEMPT)])


def main() -> int:
    classes, functions = sizes()
    print(f"largest classes (the limit, {CLASS_LIMIT}, holds in {' and '.join(CLASS_AREAS)}):")
    print("\n".join(map(str, classes[:10])))
    print(f"largest functions outside {', '.join(FUNCTION_EXEMPT)} (limit {FUNCTION_LIMIT}):")
    print("\n".join(map(str, [f for f in functions if not in_area(f, FUNCTION_EXEMPT)][:10])))
    big_classes, big_functions = oversized()
    return 1 if big_classes or big_functions else 0


if __name__ == "__main__":
    sys.exit(main())

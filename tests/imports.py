"""Every import in a Python package, read from its source with ast, for the layering rules (tests/unit/test_layering.py).

Python itself would tell us only the imports that ran; a cycle through an import under `if TYPE_CHECKING:` or inside
a function stays hidden until a type checker or a rarely taken path trips on it. So this walks the syntax trees:
every `import` and `from ... import` anywhere in a module counts, with where it is and how it is reached. Relative
imports are resolved, and `from pkg import name` points at the module `pkg.name` when there is one (else at `pkg`).
Importing `a.b.c` also runs the `__init__` of `a` and `a.b`; those implicit edges are left out, since a package's
`__init__` that re-exports its own modules is not a layering question.

Run it (`python tests/imports.py [MODULE]`) to print each module's imports inside controller/corral, and any cycle.
Reads source files only: nothing is imported or executed.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

REPO = Path(__file__).resolve().parents[1]
CORRAL = REPO / "controller" / "corral"

How = Literal["top level", "under TYPE_CHECKING", "inside a function"]


@dataclass(frozen=True)
class Import:
    """One imported module, as one statement of `source` names it."""

    source: str  # the importing module, e.g. corral.contract.model
    target: str  # the imported module, e.g. corral.contract.values or kopf
    path: Path
    line: int
    how: How

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.path.name}:{self.line}, {self.how})"


def modules(root: Path) -> dict[str, Path]:
    """The package's modules by dotted name (`root`'s own name first): `pkg/a/__init__.py` is `pkg.a`."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(root: Path) -> list[Import]:
    """Every import statement in every module under root, one Import per imported module."""
    known = modules(root)
    return [found for name, path in known.items() for found in _imports_of(name, path, known)]


def _imports_of(name: str, path: Path, known: dict[str, Path]) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node, how in _statements(tree.body, "top level"):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, path, node.lineno, how)
            continue
        base = _absolute(node, package)
        for alias in node.names:
            inner = f"{base}.{alias.name}"
            yield Import(name, inner if inner in known else base, path, node.lineno, how)


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def _statements(body: Iterable[ast.AST], how: How) -> Iterator[tuple[ast.Import | ast.ImportFrom, How]]:
    """Import statements with how each is reached: a function's body counts as inside a function, however deep."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, how
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _statements(ast.iter_child_nodes(node), "inside a function")
        elif isinstance(node, ast.If) and how == "top level" and _is_type_checking(node.test):
            yield from _statements(node.body, "under TYPE_CHECKING")
            yield from _statements(node.orelse, how)
        else:
            yield from _statements(ast.iter_child_nodes(node), how)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def within(name: str, package: str) -> bool:
    """Whether module `name` is `package` or inside it."""
    return name == package or name.startswith(package + ".")


def cycles(found: Iterable[Import]) -> list[list[Import]]:
    """One shortest cycle per group of modules that import each other, as the chain of imports that closes it."""
    edges: dict[str, dict[str, Import]] = defaultdict(dict)
    for imp in found:
        if imp.source != imp.target:
            edges[imp.source].setdefault(imp.target, imp)
    return [_shortest_cycle(min(group), edges) for group in _strongly_connected(edges) if len(group) > 1]


def _strongly_connected(edges: dict[str, dict[str, Import]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (a deep package would overflow the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    groups.append(group)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, {})))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return groups


def _shortest_cycle(start: str, edges: dict[str, dict[str, Import]]) -> list[Import]:
    """Breadth first from start back to start: the fewest imports that lead round."""
    came: dict[str, Import] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target, imp in sorted(edges.get(node, {}).items()):
            if target == start:
                chain = [imp]
                while chain[0].source != start:
                    chain.insert(0, came[chain[0].source])
                return chain
            if target not in came:
                came[target] = imp
                queue.append(target)
    raise AssertionError(f"{start} is in a cycle but no path leads back to it")


def shown(cycle: list[Import]) -> str:
    """`a -> b -> a`, then each import with where it is."""
    path = " -> ".join([cycle[0].source, *(imp.target for imp in cycle)])
    return path + "".join(f"\n    {imp}" for imp in cycle)


def main(argv: list[str]) -> int:
    found = imports(CORRAL)
    for imp in found:
        if within(imp.target, "corral") and (not argv or within(imp.source, argv[0])):
            print(imp)
    loops = cycles(imp for imp in found if within(imp.target, "corral"))
    for cycle in loops:
        print("CYCLE", shown(cycle))
    return 1 if loops else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Reads of `metadata`, `spec` and `status` on raw dicts in reconcile/ and gateway/, counted per file.

Objects become pydantic models where they enter (corral.kube.typed); past that point code reads
`intent.spec.actuator`, not `body["spec"]["actuator"]`. A raw read is a subscript `x["metadata"]` being read (not
assigned) or a call `x.get("metadata")`, and the same for spec and status. Dicts built for the API (a patch's
`{"status": {...}}`) are writes and are not counted.

`python tests/rawreads.py` prints the count per file; tests/unit/test_raw_reads.py holds the total to its ceiling.
Reads source files only.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORRAL = REPO / "controller" / "corral"
AREAS = ("reconcile", "gateway")
KEYS = frozenset({"metadata", "spec", "status"})
# Counted before objects were typed at the edge (issue 29): reconcile 187, gateway 50.
BASELINE = 237


def is_raw_read(node: ast.AST) -> bool:
    if isinstance(node, ast.Subscript):
        return (isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant)
                and node.slice.value in KEYS)
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value in KEYS)


def count(path: Path) -> int:
    return sum(map(is_raw_read, ast.walk(ast.parse(path.read_text(), str(path)))))


def counts(root: Path = CORRAL) -> Counter[str]:
    """Raw reads per file (relative to root's parent, e.g. corral/gateway/tasks.py), files without any left out."""
    found: Counter[str] = Counter()
    for area in AREAS:
        for path in sorted((root / area).rglob("*.py")):
            if reads := count(path):
                found[str(path.relative_to(root.parent))] = reads
    return found


def main() -> int:
    found = counts()
    for area in AREAS:
        print(f"{area}: {sum(n for name, n in found.items() if name.startswith(f'corral/{area}/'))}")
    for name, reads in found.most_common():
        print(f"{reads:5}  {name}")
    total = sum(found.values())
    print(f"total {total} (baseline {BASELINE}: {100 * (BASELINE - total) / BASELINE:.0f} % fewer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

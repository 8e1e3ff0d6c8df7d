"""The import walker behind the layering rules (tests/imports.py) finds what a quiet import checker misses.

Each case builds a tiny package in tmp_path, so that every rule in test_layering.py is shown able to fail: a cycle
closed by an import under TYPE_CHECKING, one closed inside a function, relative imports, `from pkg import module`.
"""

from __future__ import annotations

from pathlib import Path

from tests.imports import Import, cycles, imports, shown


def package(root: Path, files: dict[str, str]) -> Path:
    """Write a package `pkg` under root from {relative path: source}; every folder gets an __init__.py."""
    pkg = root / "pkg"
    for name, source in {"__init__.py": "", **files}.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(source)
    return pkg


def edges(found: list[Import]) -> set[tuple[str, str, str]]:
    return {(imp.source, imp.target, imp.how) for imp in found if imp.target.startswith("pkg")}


def test_a_cycle_through_an_import_under_type_checking_is_found(tmp_path: Path) -> None:
    pkg = package(tmp_path, {
        "a.py": "from pkg.b import B\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\nB = 1\n",
    })
    (cycle,) = cycles(imports(pkg))
    assert shown(cycle).splitlines()[0] == "pkg.a -> pkg.b -> pkg.a"
    assert [imp.how for imp in cycle] == ["top level", "under TYPE_CHECKING"]


def test_a_cycle_through_a_function_local_import_is_found(tmp_path: Path) -> None:
    pkg = package(tmp_path, {
        "model.py": "def check():\n    from pkg.values import check\n    return check\n",
        "values.py": "import pkg.model\n",
    })
    (cycle,) = cycles(imports(pkg))
    assert shown(cycle).splitlines()[0] == "pkg.model -> pkg.values -> pkg.model"
    assert "model.py:2, inside a function" in shown(cycle)


def test_a_longer_cycle_is_named_the_shortest_way_round(tmp_path: Path) -> None:
    pkg = package(tmp_path, {
        "a.py": "import pkg.b\nimport pkg.c\n",
        "b.py": "import pkg.c\n",
        "c.py": "import typing\nif typing.TYPE_CHECKING:\n    import pkg.a\n",
    })
    (cycle,) = cycles(imports(pkg))
    assert shown(cycle).splitlines()[0] == "pkg.a -> pkg.c -> pkg.a"


def test_relative_imports_and_from_package_import_module_point_at_the_module(tmp_path: Path) -> None:
    pkg = package(tmp_path, {
        "sub/__init__.py": "from . import one\n",
        "sub/one.py": "from .two import X\nfrom .. import top\nfrom ..top import name\n",
        "sub/two.py": "X = 1\n",
        "top.py": "from pkg import sub\nfrom pkg.sub import X\nname = 1\n",
    })
    assert edges(imports(pkg)) == {
        ("pkg.sub", "pkg.sub.one", "top level"),
        ("pkg.sub.one", "pkg.sub.two", "top level"),
        ("pkg.sub.one", "pkg.top", "top level"),
        ("pkg.top", "pkg.sub", "top level"),
    }


def test_a_package_without_loops_has_no_cycles_and_imports_of_other_packages_are_kept(tmp_path: Path) -> None:
    pkg = package(tmp_path, {
        "a.py": "import json\nfrom pkg import b\n\nclass A:\n    async def go(self):\n        import kopf\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import asyncio\nelse:\n    import os\n",
    })
    found = imports(pkg)
    assert cycles(found) == []
    assert {(imp.source, imp.target, imp.how) for imp in found} == {
        ("pkg.a", "json", "top level"),
        ("pkg.a", "pkg.b", "top level"),
        ("pkg.a", "kopf", "inside a function"),
        ("pkg.b", "typing", "top level"),
        ("pkg.b", "asyncio", "under TYPE_CHECKING"),
        ("pkg.b", "os", "top level"),
    }

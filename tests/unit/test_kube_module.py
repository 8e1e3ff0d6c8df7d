"""The Go module that builds the local kube-apiserver stays consistent with itself."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from corral.devcluster import kubebinary


def test_every_staging_module_is_pinned_to_the_matching_release() -> None:
    src = kubebinary.source_dir()
    version = kubebinary.kube_version(src)
    assert re.fullmatch(r"v1\.\d+\.\d+", version)
    staging = "v0." + version.removeprefix("v1.")
    replaces = re.findall(r"^\s*(k8s\.io/[\w-]+) => (k8s\.io/[\w-]+) (v\S+)$", (src / "go.mod").read_text(), re.M)
    assert len(replaces) >= 30
    wrong = [(old, new, v) for old, new, v in replaces if old != new or v != staging]
    assert wrong == [], f"staging modules must be pinned to {staging}"


def test_editing_the_module_changes_the_cache_key(tmp_path: Path) -> None:
    copy = tmp_path / "kube"
    shutil.copytree(kubebinary.source_dir(), copy, ignore=shutil.ignore_patterns("corral-kube*"))
    before = kubebinary.source_hash(copy)
    main = copy / "main.go"
    main.write_text(main.read_text() + "\n// changed\n")
    assert kubebinary.source_hash(copy) != before


def test_version_is_stamped_into_both_version_packages() -> None:
    flags = kubebinary._ldflags("v1.36.3")
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {package}.gitVersion=v1.36.3" in flags
        assert f"-X {package}.gitMinor=36" in flags

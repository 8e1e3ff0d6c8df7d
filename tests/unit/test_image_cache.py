"""The image cache: an archive present under its content tag is the image (nothing is built again), and old
builds of the Corral image do not pile up."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.devcluster.imagecache import archive_path, cached_image, prune_archives


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CORRAL_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_an_archive_under_its_tag_is_built_once_and_then_found() -> None:
    builds: list[Path] = []

    def build(archive: Path) -> None:
        builds.append(archive)
        archive.write_bytes(b"image")

    said: list[str] = []
    first = cached_image("busybox", "corral.local/busybox:abc", "abc", build, said.append)
    second = cached_image("busybox", "corral.local/busybox:abc", "abc", build, said.append)
    assert first == second and first.archive == archive_path("busybox", "abc")
    assert builds == [first.archive]
    assert said[0] == "building image corral.local/busybox:abc" and said[1].startswith("built image")
    cached_image("busybox", "corral.local/busybox:def", "def", build, said.append)
    assert len(builds) == 2, "another tag is another image"


def test_a_failed_build_leaves_no_archive_so_the_next_run_builds_again() -> None:
    def fail(archive: Path) -> None:
        raise RuntimeError("mmdebstrap failed")

    with pytest.raises(RuntimeError):
        cached_image("python", "corral.local/python:abc", "abc", fail, lambda line: None)
    assert not archive_path("python", "abc").exists()


def test_pruning_keeps_the_newest_archives_of_one_name_only() -> None:
    for age, tag in enumerate(["0.2.0-new", "0.1.0-mid", "0.1.0-old", "0.1.0-oldest"]):
        path = archive_path("corral", tag)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
        os.utime(path, (1_000_000 - age, 1_000_000 - age))
    archive_path("coredns", "zzz").write_bytes(b"x")
    removed = prune_archives("corral", keep=2)
    assert sorted(image.ref for image in removed) == ["corral.local/corral:0.1.0-old", "corral.local/corral:0.1.0-oldest"]
    assert archive_path("corral", "0.2.0-new").exists() and archive_path("corral", "0.1.0-mid").exists()
    assert archive_path("coredns", "zzz").exists()


def test_a_build_prunes_the_oldest_archives_of_its_name_and_says_which() -> None:
    pruned: list[str] = []
    for tag in ("a", "b", "c", "d"):
        cached_image("corral", f"corral.local/corral:{tag}", tag, lambda archive: archive.write_bytes(b"x"),
                     lambda line: None, on_pruned=lambda images: pruned.extend(i.ref for i in images))
    assert pruned == ["corral.local/corral:a"]
    assert [archive_path("corral", t).exists() for t in ("a", "b", "c", "d")] == [False, True, True, True]
    assert not archive_path("corral", "a").with_name("corral-a.tar.lock").exists()

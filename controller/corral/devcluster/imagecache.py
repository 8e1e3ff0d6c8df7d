"""The image cache: one docker-archive per image and content tag in `<cache>/images/`, built once under a lock."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corral.devcluster.gobuild import Progress, cache_root
from corral.devcluster.imagehash import image_ref

# Per image name: two Corral versions side by side (an upgrade test) and one older build; a Corral archive is
# about 450 MB, and every change to the sources it copies makes a new one.
KEEP_ARCHIVES = 3


@dataclass(frozen=True)
class NodeImage:
    """A built image: its name and the docker-archive that holds it."""

    name: str
    ref: str
    archive: Path


def images_dir() -> Path:
    return cache_root() / "images"


def archive_path(name: str, tag: str) -> Path:
    return images_dir() / f"{name}-{tag}.tar"


def cached_image(name: str, ref: str, tag: str, build: Callable[[Path], None], progress: Progress,
                 on_pruned: Callable[[list[NodeImage]], None] | None = None) -> NodeImage:
    """The archive for `name` at content tag `tag`, made (locked per entry) by `build(archive)` if absent.

    `build` writes the archive at that path atomically (a partial file renamed at the end). After a build,
    all but the KEEP_ARCHIVES newest archives of `name` are deleted, and their images dropped from buildah's
    storage (where the Corral build and the tests put them), or handed to `on_pruned` instead.
    """
    archive = archive_path(name, tag)
    if not archive.is_file():
        archive.parent.mkdir(parents=True, exist_ok=True)
        with open(archive.with_name(archive.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not archive.is_file():
                started = time.monotonic()
                progress(f"building image {ref}")
                build(archive)
                size_mib = archive.stat().st_size / 2**20
                progress(f"built image {ref} in {time.monotonic() - started:.0f}s ({size_mib:.0f} MiB, {archive})")
                pruned = prune_archives(name, KEEP_ARCHIVES)
                if pruned:
                    (on_pruned or forget_in_buildah)(pruned)
    return NodeImage(name=name, ref=ref, archive=archive)


def prune_archives(name: str, keep: int) -> list[NodeImage]:
    """Delete all but the `keep` newest archives of `name` (they are rebuilt on demand); what was deleted."""
    archives = sorted(images_dir().glob(f"{name}-*.tar"), key=lambda p: p.stat().st_mtime, reverse=True)
    removed: list[NodeImage] = []
    for archive in archives[keep:]:
        tag = archive.name[len(name) + 1 : -len(".tar")]
        archive.unlink(missing_ok=True)
        archive.with_name(archive.name + ".lock").unlink(missing_ok=True)
        removed.append(NodeImage(name=name, ref=image_ref(name, tag), archive=archive))
    return removed


def forget_in_buildah(images: list[NodeImage]) -> None:
    """Drop these images from buildah's storage, where present."""
    buildah = shutil.which("buildah")
    if buildah is None:
        return
    for image in images:
        subprocess.run([buildah, "rmi", image.ref], capture_output=True)  # absent already: nothing to do

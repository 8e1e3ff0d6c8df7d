"""The Corral image, from the repository's Dockerfile unchanged, built with buildah on the local Python base.

`buildah bud --build-arg PYTHON_IMAGE=corral.local/python:TAG` replaces the registry's python:3.11-slim;
the build's `pip install` reaches PyPI over the host's network. Where the host reaches PyPI through a
TLS-inspecting proxy, its CA bundle and a pip.conf naming it are mounted for the build's RUN steps only
(`--volume`): nothing of the host ends up in the image.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from corral import __version__
from corral.devcluster import images_debian
from corral.devcluster.buildstep import run_reporting
from corral.devcluster.errors import DevClusterError
from corral.devcluster.gobuild import Progress
from corral.devcluster.imagecache import NodeImage, cached_image
from corral.devcluster.imagehash import corral_content_hash, corral_tag, image_ref

DEFAULT_VERSION = __version__  # what `corral --version` says in the image built from these sources
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def repository() -> Path:
    return Path(__file__).resolve().parents[3]


def corral_ref(version: str = DEFAULT_VERSION, context: Path | None = None) -> str:
    """The Corral image's name for the current sources; builds nothing."""
    context = context or repository()
    base_tag = images_debian.tag(images_debian.PYTHON)
    return image_ref("corral", corral_tag(version, corral_content_hash(context, base_tag)))


def corral(progress: Progress = print, version: str = DEFAULT_VERSION, context: Path | None = None) -> NodeImage:
    """Build (or find) the Corral image of `version` (its CORRAL_VERSION label and tag) from `context`."""
    context = context or repository()
    if not (context / "Dockerfile").is_file():
        raise DevClusterError(f"{context / 'Dockerfile'} is missing; the Corral image is built from a source checkout")
    base = images_debian.python_base(progress)
    base_tag = base.ref.rsplit(":", 1)[1]
    tag = corral_tag(version, corral_content_hash(context, base_tag))
    ref = image_ref("corral", tag)

    def build(archive: Path) -> None:
        buildah = _buildah()
        _load(buildah, base.ref, base.archive)
        # No --layers: buildah 1.28 keys every step's cache on all build args, so another CORRAL_VERSION reuses
        # nothing, and the kept intermediate images would only fill the storage.
        command = [buildah, "bud", "--network", "host", "--layers=false", "--rm", "--force-rm", "--pull=never",
                   "--build-arg", f"PYTHON_IMAGE={base.ref}", "--build-arg", f"CORRAL_VERSION={version}",
                   *_pip_trust_volumes(archive.parent), "-f", str(context / "Dockerfile"), "-t", ref, str(context)]
        _run_with_progress(command, progress)
        partial = archive.with_name(archive.name + ".partial")
        partial.unlink(missing_ok=True)
        _check([buildah, "push", "--quiet", ref, f"docker-archive:{partial}:{ref}"])
        partial.rename(archive)

    return cached_image("corral", ref, tag, build, progress)


def _pip_trust_volumes(directory: Path) -> list[str]:
    """Mounts for RUN steps so that pip trusts what the host trusts (PIP_CERT / pip.conf's cert)."""
    bundle = Path(os.environ.get("PIP_CERT") or HOST_CA_BUNDLE)
    if not bundle.is_file():
        return []
    conf = directory / "build-pip.conf"
    text = "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n"
    if not conf.is_file() or conf.read_text() != text:
        conf.write_text(text)
    return ["--volume", f"{bundle}:/etc/ssl/certs/ca-certificates.crt:ro", "--volume", f"{conf}:/etc/pip.conf:ro"]


def _buildah() -> str:
    path = shutil.which("buildah")
    if path is None:
        raise DevClusterError("buildah is needed to build the Corral image and was not found; "
                              "install it (apt-get install buildah) and run the command again")
    return path


def _load(buildah: str, ref: str, archive: Path) -> None:
    """Put the base into buildah's storage from its archive, unless it is there already."""
    present = subprocess.run([buildah, "inspect", "--type", "image", ref], capture_output=True, text=True)
    if present.returncode != 0:
        _check([buildah, "pull", "--quiet", f"docker-archive:{archive}"])


def _check(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise DevClusterError(f"{' '.join(command)} failed (exit {done.returncode}):\n{done.stderr.strip()[-3000:]}")


def _run_with_progress(command: list[str], progress: Progress) -> None:
    code, lines = run_reporting(command, "corral image", progress, _latest_step)
    if code != 0:
        detail = "\n".join(lines[-40:])
        raise DevClusterError(f"buildah bud of the Corral image failed (exit {code}):\n{detail}")


def _latest_step(lines: list[str]) -> str:
    return next((line for line in reversed(lines) if "STEP " in line), "starting")[:100]

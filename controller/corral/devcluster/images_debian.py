"""Images whose root filesystem is made with mmdebstrap from Debian bookworm's packages, through the host's
own apt sources: the Python base of the Corral image, and the broker laid out as eclipse-mosquitto.

The content hash covers the recipe (suite, variant, packages, hooks, the image config and any added files)
and the apt sources, not the packages' bytes: the mirror moves within bookworm's point releases, and a
rebuild is one `rm` of the archive away.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from corral.devcluster.buildstep import run_reporting
from corral.devcluster.errors import DevClusterError
from corral.devcluster.gobuild import Progress
from corral.devcluster.imagecache import NodeImage, cached_image
from corral.devcluster.imagehash import TAG_LENGTH, HashInputs, image_ref
from corral.devcluster.imagelayers import (
    Entry,
    ImageConfig,
    assemble,
    directory,
    layer_hash,
    symlink,
    write_layer,
    written,
)

SUITE = "bookworm"  # Python 3.11, the Dockerfile's python:3.11-slim-bookworm
SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
MOSQUITTO_UID = 1883  # eclipse-mosquitto's user and group; the chart's pod securityContext runs as it

# As the slim images do: no manuals, docs (but their copyright) or translations.
_SLIM = (
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
)


@dataclass(frozen=True)
class DebianRecipe:
    name: str
    variant: str
    packages: tuple[str, ...]
    config: ImageConfig
    hooks: tuple[str, ...] = ()  # mmdebstrap --customize-hook commands, run with the root directory as $1
    added: tuple[Entry, ...] = ()  # a second layer over the root filesystem

    def mmdebstrap_args(self, sources: Path, output: Path) -> list[str]:
        return [
            f"--variant={self.variant}",
            f"--include={','.join(self.packages)}",
            "--skip=output/dev",  # no device nodes in the layer: the runtime makes /dev
            *_SLIM,
            *(f"--customize-hook={hook}" for hook in self.hooks),
            SUITE,
            str(output),
            str(sources),
        ]

    def content_hash(self, sources: Path) -> str:
        inputs = HashInputs(f"debian-image:{self.name}")
        inputs.add_json("mmdebstrap", self.mmdebstrap_args(Path("SOURCES"), Path("OUT.tar")))
        inputs.add_json("config", self.config.as_json())
        inputs.add("sources", sources.read_bytes() if sources.is_file() else b"")
        layer_hash(inputs, "added", self.added)
        return inputs.hexdigest()


PYTHON = DebianRecipe(
    name="python",
    variant="minbase",
    # python-is-python3: `python` exists, as in python:3.11-slim (the Dockerfile runs `python -m venv`).
    packages=("python3", "python3-venv", "python-is-python3", "ca-certificates"),
    config=ImageConfig(
        cmd=("python3",),
        env=("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"),
    ),
)

# Debian makes a system user `mosquitto` with a low uid; eclipse-mosquitto's (and the chart's) is 1883.
_RENUMBER_MOSQUITTO = (
    'chroot "$1" sh -ec \''
    "u=$(id -u mosquitto); g=$(id -g mosquitto); "
    f"groupmod -g {MOSQUITTO_UID} mosquitto; usermod -u {MOSQUITTO_UID} -g {MOSQUITTO_UID} mosquitto; "
    f"find / -xdev \\( -uid $u -o -gid $g \\) -exec chown -h {MOSQUITTO_UID}:{MOSQUITTO_UID} {{}} +'"
)

# eclipse-mosquitto's entrypoint, word for word in effect: as root it hands /mosquitto to the broker's user.
_ENTRYPOINT_SCRIPT = """#!/bin/sh
set -e
user="$(id -u)"
if [ "$user" = '0' ]; then
	[ -d "/mosquitto" ] && chown -R mosquitto:mosquitto /mosquitto || true
fi
exec "$@"
"""

# eclipse-mosquitto's default: no listener configured, so the broker listens on localhost only. The chart
# mounts its own file over /mosquitto/config.
_DEFAULT_CONF = "# Mount your own mosquitto.conf here (the Corral chart does).\n"


def _multiarch() -> str:
    return str(sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu")


MOSQUITTO = DebianRecipe(
    name="mosquitto",
    variant="essential",
    packages=("mosquitto",),
    hooks=(_RENUMBER_MOSQUITTO,),
    added=(
        directory("mosquitto/config", 0o755, MOSQUITTO_UID, MOSQUITTO_UID),
        directory("mosquitto/data", 0o755, MOSQUITTO_UID, MOSQUITTO_UID),
        directory("mosquitto/log", 0o755, MOSQUITTO_UID, MOSQUITTO_UID),
        Entry("mosquitto/config/mosquitto.conf", "file", 0o644, MOSQUITTO_UID, MOSQUITTO_UID, text=_DEFAULT_CONF),
        written("docker-entrypoint.sh", _ENTRYPOINT_SCRIPT, 0o755),
        # Where eclipse-mosquitto keeps the dynamic security plugin (the chart's mosquitto.dynsecPlugin).
        symlink("usr/lib/mosquitto_dynamic_security.so", f"{_multiarch()}/mosquitto_dynamic_security.so"),
    ),
    config=ImageConfig(
        entrypoint=("/docker-entrypoint.sh",),
        cmd=("/usr/sbin/mosquitto", "-c", "/mosquitto/config/mosquitto.conf"),
        ports=("1883/tcp",),
    ),
)


def tag(recipe: DebianRecipe, sources: Path = SOURCES) -> str:
    return recipe.content_hash(sources)[:TAG_LENGTH]


def python_base(progress: Progress = print) -> NodeImage:
    return build(PYTHON, progress)


def mosquitto(progress: Progress = print) -> NodeImage:
    return build(MOSQUITTO, progress)


def build(recipe: DebianRecipe, progress: Progress, sources: Path = SOURCES) -> NodeImage:
    if not sources.is_file():
        raise DevClusterError(f"{sources} (the host's apt sources, which mmdebstrap uses) is missing; "
                              "the node's Debian images are made from them")
    content_tag = tag(recipe, sources)
    ref = image_ref(recipe.name, content_tag)

    def make(archive: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="corral-mmdebstrap-", dir=archive.parent) as work:
            rootfs = Path(work) / "rootfs.tar"
            _mmdebstrap(recipe, sources, rootfs, progress)
            layers = [rootfs]
            if recipe.added:
                layers.append(write_layer(recipe.added, Path(work) / "added.tar"))
            assemble(layers, recipe.config, ref, archive)

    return cached_image(recipe.name, ref, content_tag, make, progress)


def _mmdebstrap(recipe: DebianRecipe, sources: Path, output: Path, progress: Progress) -> None:
    tool = shutil.which("mmdebstrap")
    if tool is None:
        raise DevClusterError("mmdebstrap is needed to make the node's Debian images and was not found; "
                              "install it (apt-get install mmdebstrap) and run the command again")
    if os.geteuid() != 0:
        raise DevClusterError("making the node's Debian images needs root (mmdebstrap's root mode: the broker's "
                              "files change owner); run as root")
    command = [tool, *recipe.mmdebstrap_args(sources, output)]
    # mmdebstrap marks its steps "I: ..."; the latest says where it is.
    code, lines = run_reporting(command, recipe.name, progress, lambda lines: lines[-1].removeprefix("I: "))
    if code != 0:
        detail = "\n".join(lines[-30:])
        raise DevClusterError(f"mmdebstrap of the {recipe.name} image failed (exit {code}):\n{detail}")

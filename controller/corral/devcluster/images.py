"""Every image the local node runs, made here (no registry is reachable), cached by content hash.

Each image is saved as a docker-archive in `<cache>/images/NAME-TAG.tar` whose tag is the hash of what
decides its content, so a warm run checks hashes and builds nothing. `import_images` loads the archives
into containerd's `k8s.io` namespace, where the kubelet finds them (the chart's pull policy is never
reached: the images are present).

- pause: Debian's static `catatonit -P`, the node's sandbox image;
- busybox: busybox-static with its applets, local-path's helper and the network tests' client;
- coredns, local-path-provisioner: their binaries built from the Go modules (addonbinaries.py);
- python (images_debian.py): a Python 3.11 base made with mmdebstrap from Debian bookworm;
- mosquitto (images_debian.py): Debian's broker, laid out as eclipse-mosquitto (what the chart expects);
- corral (images_corral.py): the repository's Dockerfile, unchanged, built with buildah on the python base.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from corral.devcluster import addonbinaries, images_corral, images_debian
from corral.devcluster.errors import DevClusterError
from corral.devcluster.gobuild import Progress
from corral.devcluster.imagecache import NodeImage, cached_image
from corral.devcluster.imagehash import PAUSE_REF, TAG_LENGTH, HashInputs, image_ref
from corral.devcluster.imagelayers import (
    CAP_NET_BIND_SERVICE,
    Entry,
    ImageConfig,
    assemble,
    copied,
    directory,
    layer_hash,
    symlink,
    write_layer,
    written,
)

CATATONIT = Path("/usr/bin/catatonit")
BUSYBOX = Path("/bin/busybox")
NONROOT = 65532  # distroless's nonroot, the user CoreDNS's own image runs as


def _from_files(name: str, layers: Sequence[Sequence[Entry]], config: ImageConfig, progress: Progress,
                ref: str | None = None) -> NodeImage:
    inputs = HashInputs(f"image:{name}").add_json("config", config.as_json())
    for i, entries in enumerate(layers):
        layer_hash(inputs, f"layer{i}", entries)
    tag = inputs.hexdigest()[:TAG_LENGTH]

    def build(archive: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="corral-layers-") as work:
            tars = [write_layer(entries, Path(work) / f"layer{i}.tar") for i, entries in enumerate(layers)]
            assemble(tars, config, ref or image_ref(name, tag), archive)

    return cached_image(name, ref or image_ref(name, tag), tag, build, progress)


def _require(path: Path, package: str) -> Path:
    if not path.is_file():
        raise DevClusterError(f"{path} is needed for the node's images and is missing; "
                              f"install Debian's {package} (apt-get install {package}) and run the command again")
    return path


def _passwd(extra: str = "") -> list[Entry]:
    return [
        written("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n" + extra
                + "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"),
        written("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
    ]


def busybox_entries() -> list[Entry]:
    """/bin/busybox and a symlink per applet at busybox's own install paths (`busybox --install -s`)."""
    binary = _require(BUSYBOX, "busybox-static")
    applets = subprocess.run([str(binary), "--list-full"], capture_output=True, text=True, check=True).stdout.split()
    entries = [copied("bin/busybox", binary),
               *(symlink(path, "/bin/busybox") for path in sorted(set(applets)) if path != "bin/busybox"),
               directory("tmp", 0o1777), directory("root", 0o700)]
    return entries + _passwd()


def pause(progress: Progress = print) -> NodeImage:
    entries = [copied("usr/bin/catatonit", _require(CATATONIT, "catatonit"))]
    # catatonit -P: an init that only reaps and waits, the pause container's whole job; 65535 as upstream pause.
    config = ImageConfig(entrypoint=("/usr/bin/catatonit", "-P"), user="65535:65535", env=())
    return _from_files("pause", [entries], config, progress, ref=PAUSE_REF)


def busybox(progress: Progress = print) -> NodeImage:
    return _from_files("busybox", [busybox_entries()], ImageConfig(cmd=("sh",)), progress)


def coredns(progress: Progress = print) -> NodeImage:
    binary = addonbinaries.ensure_coredns(progress)
    # As CoreDNS's own image (setcap cap_net_bind_service=+ep): 65532 binds port 53 with the capability its Pod adds.
    entries = [copied("coredns", binary, capabilities=(CAP_NET_BIND_SERVICE,)), *_passwd(f"nonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:/sbin/nologin\n")]
    config = ImageConfig(entrypoint=("/coredns",), user=f"{NONROOT}:{NONROOT}", ports=("53/tcp", "53/udp"), env=())
    return _from_files("coredns", [entries], config, progress)


def local_path_provisioner(progress: Progress = print) -> NodeImage:
    binary = addonbinaries.ensure_local_path_provisioner(progress)
    # Upstream's image is Alpine with the binary on PATH; busybox is the shell here.
    layers = [busybox_entries(), [copied("usr/bin/local-path-provisioner", binary)]]
    return _from_files("local-path-provisioner", layers, ImageConfig(cmd=("local-path-provisioner",)), progress)


# In build order: what the node needs first comes first.
BUILDERS: dict[str, Callable[[Progress], NodeImage]] = {
    "pause": pause,
    "busybox": busybox,
    "coredns": coredns,
    "local-path-provisioner": local_path_provisioner,
    "mosquitto": images_debian.mosquitto,
    "python": images_debian.python_base,
    "corral": images_corral.corral,
}


def ensure_images(progress: Progress = print, names: Iterable[str] | None = None,
                  corral_version: str = images_corral.DEFAULT_VERSION) -> dict[str, NodeImage]:
    """Build (or find in the cache) the named images, all of them by default; name -> NodeImage.

    `corral_version` labels and tags the Corral image (`corral.local/corral:VERSION-HASH`): a second version
    of the same sources is a second image, e.g. for `helm upgrade`.
    """
    wanted = list(BUILDERS) if names is None else list(names)
    unknown = [n for n in wanted if n not in BUILDERS]
    if unknown:
        raise DevClusterError(f"no image named {', '.join(unknown)}; the node's images are {', '.join(BUILDERS)}")
    built: dict[str, NodeImage] = {}
    for name in (n for n in BUILDERS if n in wanted):
        if name == "corral":
            built[name] = images_corral.corral(progress, version=corral_version)
        else:
            built[name] = BUILDERS[name](progress)
    return built


def import_images(ctr: str, address: Path, archives: Iterable[NodeImage], progress: Progress = print) -> None:
    """Load the archives into containerd's `k8s.io` namespace (the kubelet's), skipping images already there."""
    base = [ctr, "-a", str(address), "-n", "k8s.io"]
    listed = _ctr([*base, "images", "ls", "-q"])
    present = set(listed.split())
    for image in archives:
        if image.ref in present:
            continue
        started = time.monotonic()
        _ctr([*base, "images", "import", str(image.archive)], timeout=600)
        progress(f"imported {image.ref} into containerd in {time.monotonic() - started:.0f}s")


def _ctr(command: list[str], timeout: float = 60) -> str:
    if shutil.which(command[0]) is None and not Path(command[0]).is_file():
        raise DevClusterError(f"{command[0]} (containerd's client) was not found; install containerd")
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise DevClusterError(f"{' '.join(command)} failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout

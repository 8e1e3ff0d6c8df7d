"""Images made from files, without a registry or a daemon: layer tars written here, assembled with umoci,
saved with skopeo as a docker-archive that keeps the image's name (what `ctr images import` reads).

A layer is a list of entries (path, kind, owner, mode, where its bytes come from): its hash is computed from
that description and the source files' bytes, and the tar is written only when the image is built.
Timestamps are zero, so the same entries make the same layer.
"""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corral.devcluster.errors import DevClusterError
from corral.devcluster.imagehash import HashInputs


@dataclass(frozen=True)
class Entry:
    """One path in a layer: a directory, a file (copied from `source`, or `text`) or a symlink (`target`)."""

    path: str  # inside the image, without the leading slash
    kind: str  # "dir", "file" or "symlink"
    mode: int = 0o755
    uid: int = 0
    gid: int = 0
    source: Path | None = None
    text: str | None = None
    target: str | None = None
    # File capabilities (numbers, e.g. CAP_NET_BIND_SERVICE), effective at exec as `setcap cap_x=+ep` makes
    # them: how a non-root process gets a capability its Pod adds (the runtime sets no ambient capabilities).
    capabilities: tuple[int, ...] = ()


CAP_NET_BIND_SERVICE = 10
_XATTR_CAPABILITY = "SCHILY.xattr.security.capability"


def file_capability(capabilities: Sequence[int]) -> bytes:
    """The `security.capability` value (VFS_CAP_REVISION_2, effective) granting `capabilities` as permitted."""
    permitted = 0
    for number in capabilities:
        permitted |= 1 << number
    return struct.pack("<IIIII", 0x02000000 | 0x1, permitted & 0xFFFFFFFF, 0, permitted >> 32, 0)


def directory(path: str, mode: int = 0o755, uid: int = 0, gid: int = 0) -> Entry:
    return Entry(path.strip("/"), "dir", mode, uid, gid)


def copied(path: str, source: Path, mode: int = 0o755, capabilities: tuple[int, ...] = ()) -> Entry:
    return Entry(path.strip("/"), "file", mode, source=source, capabilities=capabilities)


def written(path: str, text: str, mode: int = 0o644) -> Entry:
    return Entry(path.strip("/"), "file", mode, text=text)


def symlink(path: str, target: str) -> Entry:
    return Entry(path.strip("/"), "symlink", 0o777, target=target)


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config a Pod's user notices."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    user: str = ""
    env: tuple[str, ...] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    workdir: str = ""
    ports: tuple[str, ...] = ()  # e.g. "53/udp"
    labels: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        return {"entrypoint": list(self.entrypoint), "cmd": list(self.cmd), "user": self.user, "env": list(self.env),
                "workdir": self.workdir, "ports": list(self.ports), "labels": self.labels}


def with_parents(entries: Sequence[Entry]) -> list[Entry]:
    """The entries, preceded by any parent directory they lack (root-owned, 0755)."""
    present = {e.path for e in entries}
    out: list[Entry] = []
    for entry in entries:
        parts = entry.path.split("/")[:-1]
        for i in range(len(parts)):
            parent = "/".join(parts[: i + 1])
            if parent not in present:
                present.add(parent)
                out.append(directory(parent))
        out.append(entry)
    return out


def layer_hash(inputs: HashInputs, label: str, entries: Sequence[Entry]) -> HashInputs:
    """Add a layer's description and its files' bytes to `inputs`."""
    for entry in with_parents(entries):
        inputs.add_json(f"{label}:entry", [entry.path, entry.kind, entry.mode, entry.uid, entry.gid, entry.target,
                                           list(entry.capabilities)])
        if entry.source is not None:
            inputs.add(f"{label}:bytes", entry.source.read_bytes())
        elif entry.text is not None:
            inputs.add(f"{label}:text", entry.text.encode())
    return inputs


def write_layer(entries: Sequence[Entry], out: Path) -> Path:
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for entry in with_parents(entries):
            info = tarfile.TarInfo(entry.path)
            info.mode, info.uid, info.gid, info.mtime = entry.mode, entry.uid, entry.gid, 0
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, entry.target or ""
                tar.addfile(info)
            else:
                data = entry.source.read_bytes() if entry.source is not None else (entry.text or "").encode()
                info.size = len(data)
                if entry.capabilities:
                    # Binary in a PAX record: tarfile writes it verbatim (hdrcharset=BINARY) when it is given as
                    # surrogate-escaped text; containerd and buildah set it as the file's xattr on unpacking.
                    blob = file_capability(entry.capabilities).decode("utf-8", "surrogateescape")
                    info.pax_headers = {_XATTR_CAPABILITY: blob}
                tar.addfile(info, io.BytesIO(data))
    return out


def assemble(layers: Sequence[Path], config: ImageConfig, ref: str, archive: Path) -> None:
    """Stack layer tars into an image named `ref` and save it as a docker-archive at `archive` (atomically)."""
    umoci, skopeo = _tool("umoci"), _tool("skopeo")
    with tempfile.TemporaryDirectory(prefix="corral-image-") as work:
        layout = f"{work}/oci"
        image = f"{layout}:image"
        _run([umoci, "init", "--layout", layout])
        _run([umoci, "new", "--image", image])
        for layer in layers:
            _run([umoci, "raw", "add-layer", "--image", image, str(layer)])
        _run([umoci, "config", "--image", image, *_config_flags(config)])
        partial = archive.with_name(archive.name + ".partial")
        partial.unlink(missing_ok=True)
        _run([skopeo, "copy", "--quiet", f"oci:{image}", f"docker-archive:{partial}:{ref}"])
        partial.rename(archive)


def _config_flags(config: ImageConfig) -> list[str]:
    flags: list[str] = []
    if config.user:
        flags += ["--config.user", config.user]
    for word in config.entrypoint:
        flags += ["--config.entrypoint", word]
    for word in config.cmd:
        flags += ["--config.cmd", word]
    for variable in config.env:
        flags += ["--config.env", variable]
    if config.workdir:
        flags += ["--config.workingdir", config.workdir]
    for port in config.ports:
        flags += ["--config.exposedports", port]
    for key, value in sorted(config.labels.items()):
        flags += ["--config.label", f"{key}={value}"]
    return flags


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise DevClusterError(f"{name} is needed to make the node's images and was not found on PATH; "
                              f"install it (Debian: apt-get install {name}) and run the command again")
    return path


def _run(command: list[str], timeout: float = 600) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise DevClusterError(f"{' '.join(command[:3])} ... failed (exit {done.returncode}):\n"
                              f"{(done.stderr or done.stdout).strip()[-3000:]}")

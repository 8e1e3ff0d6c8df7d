"""What an image's content hash covers, and the names images get: pure functions, no I/O beyond reading inputs.

A tag is a hash of everything that decides the image's content, so a cached archive with that tag is the
image, and a warm run is a hash check. For the Corral image that is exactly what the Dockerfile copies
(as its .dockerignore filters the context), the Dockerfile itself and the base image's hash.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import shlex
from collections.abc import Iterable
from pathlib import Path

REGISTRY = "corral.local"
TAG_LENGTH = 12


def image_ref(name: str, tag: str) -> str:
    """`corral.local/NAME:TAG`: a registry name nobody serves, so nothing ever tries to pull it."""
    return f"{REGISTRY}/{name}:{tag}"


PAUSE_REF = image_ref("pause", "3.10")  # the sandbox image's fixed name: containerd's config names it


def corral_tag(version: str, content_hash: str) -> str:
    """`<version>-<hash12>`: a person reads the release, the hash tells two builds of it apart."""
    return f"{version}-{content_hash[:TAG_LENGTH]}"


class HashInputs:
    """A running sha256 over named parts; each part is framed so that no two sequences of parts collide."""

    def __init__(self, kind: str) -> None:
        self._digest = hashlib.sha256()
        self.add("kind", kind.encode())

    def add(self, label: str, data: bytes) -> HashInputs:
        for chunk in (label.encode(), data):
            self._digest.update(len(chunk).to_bytes(8, "big"))
            self._digest.update(chunk)
        return self

    def add_json(self, label: str, value: object) -> HashInputs:
        return self.add(label, json.dumps(value, sort_keys=True, separators=(",", ":")).encode())

    def add_file(self, label: str, path: Path) -> HashInputs:
        # The executable bit is content too: COPY keeps it, and a script without it does not run.
        mode = "x" if path.stat().st_mode & 0o111 else "-"
        return self.add(f"{label}:{mode}", path.read_bytes())

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def dockerfile_copy_sources(dockerfile_text: str) -> list[str]:
    """The build-context paths the Dockerfile's COPY and ADD instructions read (not `--from=` stage copies)."""
    sources: list[str] = []
    for instruction in _instructions(dockerfile_text):
        words = shlex.split(instruction, comments=False)
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        args = words[1:]
        if any(arg.startswith("--from") for arg in args):
            continue
        paths = [arg for arg in args if not arg.startswith("--")]
        sources.extend(paths[:-1])  # the last is the destination
    return sources


def _instructions(text: str) -> list[str]:
    """Logical lines: comments dropped, backslash continuations joined."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") and not current:
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        if current:
            lines.append(current)
        current = ""
    if current:
        lines.append(current)
    return lines


def dockerignore_patterns(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def is_ignored(relative: str, patterns: list[str]) -> bool:
    """.dockerignore's rule: the last matching pattern wins, `!` re-includes; `**/` matches at any depth.

    Patterns also match a path's parent directories, so `**/__pycache__` excludes everything under one.
    """
    ignored = False
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        body = body.strip("/")
        if any(_matches(prefix, body) for prefix in prefixes):
            ignored = not negated
    return ignored


def _matches(path: str, pattern: str) -> bool:
    if pattern.startswith("**/"):
        tail = pattern[3:]
        segments = path.split("/")
        return any(fnmatch.fnmatchcase("/".join(segments[i:]), tail) for i in range(len(segments)))
    return fnmatch.fnmatchcase(path, pattern) and path.count("/") == pattern.count("/")


def context_files(context: Path, sources: Iterable[str], ignore: list[str]) -> list[Path]:
    """The files the COPY sources bring from `context`, as the .dockerignore patterns leave them; sorted."""
    found: set[Path] = set()
    for source in sources:
        top = context / source.rstrip("/").removeprefix("./")
        if not top.exists():
            raise FileNotFoundError(f"the Dockerfile copies {source}, which is not in {context}")
        candidates = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in candidates:
            relative = path.relative_to(context).as_posix()
            if not is_ignored(relative, ignore):
                found.add(path)
    return sorted(found)


def corral_content_hash(context: Path, base_hash: str, dockerfile: str = "Dockerfile") -> str:
    """The Corral image's hash: its Dockerfile, the files it copies (after .dockerignore) and the base's hash."""
    dockerfile_path = context / dockerfile
    text = dockerfile_path.read_text()
    ignore_file = context / ".dockerignore"
    ignore = dockerignore_patterns(ignore_file.read_text()) if ignore_file.exists() else []
    inputs = HashInputs("corral-image").add("base", base_hash.encode()).add("Dockerfile", text.encode())
    for path in context_files(context, dockerfile_copy_sources(text), ignore):
        inputs.add_file(path.relative_to(context).as_posix(), path)
    return inputs.hexdigest()

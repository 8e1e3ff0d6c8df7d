"""Files only their owner may read (mode 0600): passwords, private keys, credentials."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, data: bytes | str) -> None:
    """Replace `path` with `data`, mode 0600 from the first byte on (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data.encode() if isinstance(data, str) else data)
    os.replace(temporary, path)

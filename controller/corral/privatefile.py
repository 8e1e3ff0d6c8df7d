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


class SecretFileError(ValueError):
    """A file that should hold a secret is missing, unreadable, empty, or readable by others."""


def read_private(path: str | Path, what: str = "secret") -> bytes:
    """The bytes of `path`, after checking that no one else could have read them.

    The rule is PostgreSQL's for its key files: mode 0600 or stricter, or 0640 or stricter when root owns the
    file, which is how Kubernetes mounts a Secret volume for a Pod with an fsGroup (the group is the Pod's own).
    A secret others could read is refused rather than used: it may have leaked already, and saying so now is
    the only time anyone will notice.
    """
    path = Path(path)
    try:
        info = path.stat()
        data = path.read_bytes()
    except FileNotFoundError:
        raise SecretFileError(f"the {what} file {path} does not exist") from None
    except OSError as err:
        raise SecretFileError(f"cannot read the {what} file {path}: {err.strerror or err}") from None
    mode = info.st_mode & 0o777
    allowed = 0o640 if info.st_uid == 0 else 0o600
    if mode & ~allowed:
        owner = "root" if info.st_uid == 0 else "its owner"
        raise SecretFileError(f"the {what} file {path} has mode {mode:04o}: others could read it. Allowed: "
                              f"{allowed:04o} or stricter for a file owned by {owner} (chmod 600 {path})")
    if info.st_uid not in (0, os.geteuid()):
        raise SecretFileError(f"the {what} file {path} belongs to uid {info.st_uid}: it must be yours or root's")
    return data


def read_secret(path: str | Path, what: str = "secret") -> str:
    """The secret in `path` (its first line; a trailing newline is not part of it), read by `read_private`."""
    lines = read_private(path, what).decode().splitlines()
    secret = lines[0] if lines else ""
    if not secret.strip():
        raise SecretFileError(f"the {what} file {path} is empty")
    return secret

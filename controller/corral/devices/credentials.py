"""The credentials file: what enrolled devices need to connect, as `corral devices enroll --write` leaves it.

    {"devices": {"porch-light": {"username": "porch-light", "password": "..."}, ...}}

`corral sim --credentials FILE` connects each simulated device with its own entry; a person copies an
entry to a board's configuration. The file holds secrets: it is written with mode 0600 and merged, never
truncated, so enrolling one more device keeps the others.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from corral.privatefile import write_private


class CredentialsError(Exception):
    """The credentials file cannot be read, with what is wrong in it."""


def read_credentials(path: str | Path) -> dict[str, str]:
    """device id -> password."""
    try:
        document = json.loads(Path(path).read_text())
    except OSError as err:
        raise CredentialsError(f"cannot read the credentials file {path}: {err.strerror}") from None
    except ValueError as err:
        raise CredentialsError(f"the credentials file {path} is not JSON: {err}") from None
    devices = document.get("devices") if isinstance(document, dict) else None
    if not isinstance(devices, dict):
        raise CredentialsError(f'the credentials file {path} has no "devices" object (as `corral devices enroll '
                               '--write` writes it: {"devices": {"<id>": {"username": ..., "password": ...}}})')
    found: dict[str, str] = {}
    for device_id, entry in devices.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("password"), str):
            raise CredentialsError(f"the credentials file {path}: device {device_id!r} has no password")
        if entry.get("username", device_id) != device_id:
            raise CredentialsError(f"the credentials file {path}: device {device_id!r} has the username "
                                   f"{entry.get('username')!r}; a device's username is its id")
        found[str(device_id)] = entry["password"]
    return found


def write_credentials(path: str | Path, passwords: Mapping[str, str]) -> None:
    """Merge these devices (id -> password) into the file, private to its owner."""
    target = Path(path)
    existing = read_credentials(target) if target.exists() else {}
    merged = {**existing, **passwords}
    document = {"devices": {device_id: {"username": device_id, "password": password}
                            for device_id, password in sorted(merged.items())}}
    write_private(target, json.dumps(document, indent=2) + "\n")

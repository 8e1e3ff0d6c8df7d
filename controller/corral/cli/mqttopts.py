"""The broker account's password, from a file: never in a URL on the command line or in the environment.

A process's arguments (/proc/PID/cmdline) are readable by every local account, and its environment is
inherited by every child it starts. So `--mqtt` carries the username only, and the password comes from a
file only its owner can read (`--mqtt-password-file`, a Secret volume in the chart). Shared by `corral run`,
`corral sim --shared-account` and `corral demo`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import click

from corral.devices.link import BrokerAddress
from corral.privatefile import SecretFileError, read_secret

PASSWORD_FILE_ENV = "CORRAL_MQTT_PASSWORD_FILE"
PASSWORD_FILE_HELP = (f"File holding the broker account's password alone (mode 0600, or 0640 owned by root as a "
                      f"Secret volume mounts it) [env {PASSWORD_FILE_ENV}]. The username stays in the URL.")


def password_file_option(command: Any) -> Any:
    return click.option("--mqtt-password-file", "mqtt_password_file", envvar=PASSWORD_FILE_ENV, metavar="FILE",
                        type=click.Path(dir_okay=False), help=PASSWORD_FILE_HELP)(command)


def refuse_password_in_url(url: str, option: str = "--mqtt") -> None:
    """A usage error, if the URL carries a password, that says how to pass it instead (without repeating it)."""
    parts = urlsplit(url if "://" in url else f"mqtt://{url}")
    if parts.password is not None:
        address = f"{parts.scheme}://{parts.username or 'USER'}@{parts.hostname or 'HOST'}" + \
            (f":{parts.port}" if parts.port else "")
        raise click.BadParameter(
            f"the URL carries a password, and every local account can read a process's arguments and environment. "
            f"Keep only the username in the URL ({address}) and put the password alone in a file only you can read "
            f"(chmod 600 FILE): --mqtt-password-file FILE or {PASSWORD_FILE_ENV}=FILE", param_hint=option)


def broker_password(url: str, password_file: str | None, option: str = "--mqtt") -> str | None:
    """The password for the account in `url`, read from `password_file`; None without a file."""
    refuse_password_in_url(url, option)
    try:
        address = BrokerAddress.parse(url)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint=option) from None
    if password_file is None:
        return None
    if address.username is None:
        raise click.UsageError(f"--mqtt-password-file needs the account's username in the {option} URL: "
                               f"mqtt://USER@{address.host}:{address.port}")
    try:
        return read_secret(password_file, "MQTT password")
    except SecretFileError as err:
        raise click.BadParameter(str(err), param_hint="--mqtt-password-file") from None

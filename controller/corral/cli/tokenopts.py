"""`--token` and `--token-file`: a bearer token for the controller's HTTPS server (`corral audit`, `corral
readings --server`).

A token on the command line sits in /proc/PID/cmdline, readable by every local account while the command
runs; `--token-file` (or CORRAL_TOKEN_FILE) reads it from a file only its owner may read instead. `--token`
stays for a quick look, as kubectl's does.
"""

from __future__ import annotations

from typing import Any

import click

from corral.privatefile import SecretFileError, read_secret

_FROM_FILE = "corral.token_from_file"


def _token(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None and ctx.meta.get(_FROM_FILE):
        raise click.UsageError("give --token or --token-file, not both")
    return value if value is not None else ctx.params.get("token")


def _token_file(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is None:
        return
    if ctx.params.get("token") is not None:
        raise click.UsageError("give --token or --token-file, not both")
    try:
        ctx.params["token"] = read_secret(value, "token")
    except SecretFileError as err:
        raise click.BadParameter(str(err), param_hint="--token-file") from None
    ctx.meta[_FROM_FILE] = True


def token_options(what: str) -> Any:
    """Both options; the command receives `token` (from either)."""

    def decorate(command: Any) -> Any:
        command = click.option("--token-file", envvar="CORRAL_TOKEN_FILE", type=click.Path(dir_okay=False),
                               expose_value=False, callback=_token_file, metavar="FILE",
                               help=f"--server: a file holding {what} (mode 0600; env CORRAL_TOKEN_FILE).")(command)
        return click.option("--token", envvar="CORRAL_TOKEN", callback=_token,
                            help=f"--server: {what} (default: the kubeconfig's; env CORRAL_TOKEN). Every local "
                                 "account can read a command's arguments: prefer --token-file.")(command)

    return decorate

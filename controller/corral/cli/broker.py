"""`corral broker init-dynsec`: the starting state of a Mosquitto broker that Corral manages.

The chart's bundled Mosquitto runs this in an init container (the Corral image) before the broker starts:
it writes the dynamic security plugin's state file with one account, the controller's (`corral-controller`,
its password from the environment, never from the command line), whose role may use every topic and run
the plugin (`$CONTROL/dynamic-security/#`); everyone else is denied by default. The broker keeps no
persistence: the controller re-creates every enrolled device's account from the enrollment Secrets each
time it connects.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import click

from corral.devcluster import files

PASSWORD_ENV = "CORRAL_BROKER_CONTROLLER_PASSWORD"


@click.group()
def broker() -> None:
    """Prepare a Mosquitto broker for Corral (dynamic security plugin)."""


@broker.command("init-dynsec")
@click.option("--file", "path", type=click.Path(dir_okay=False, writable=True, path_type=Path), required=True,
              help="Where to write the plugin's state (its plugin_opt_config_file); replaced if it exists.")
def init_dynsec(path: Path) -> None:
    """Write the dynamic security plugin's starting state: the controller's account only, deny by default.

    The controller's password comes from the environment variable CORRAL_BROKER_CONTROLLER_PASSWORD. The file is written
    with mode 0600 (the broker reads and rewrites it).
    """
    password = os.environ.get(PASSWORD_ENV, "")
    if not password:
        raise click.UsageError(f"set {PASSWORD_ENV} to the controller's broker password "
                               f"(the account {files.BROKER_CONTROLLER})")
    state = files.dynsec_config(password, None, (secrets.token_bytes(12),))
    data = (json.dumps(state, indent=1) + "\n").encode()
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except OSError as err:
        raise click.ClickException(f"cannot write {path}: {err.strerror or err}") from None
    click.echo(f"Wrote {path}: account {files.BROKER_CONTROLLER}, deny by default for everyone else.", err=True)

"""`corral broker init-dynsec | acl-file | new-ca`: preparing a broker for Corral.

`init-dynsec` is the starting state of a Mosquitto broker that Corral manages.

The chart's bundled Mosquitto runs this in an init container (the Corral image) before the broker starts:
it writes the dynamic security plugin's state file with the controller's accounts (`corral-controller`, or one
per replica with `--controller-username NAME` repeated: each replica connects as its own, since the client id is
the username), all with one password from a file, `--password-file`, mounted from a Secret (never an argument or
a variable), and one role that sends commands and heartbeats, hears devices and runs the plugin
(`files.controller_acls`); everyone else is denied by default. The broker keeps no
persistence: the controller re-creates every enrolled device's account from the enrollment Secrets each
time it connects.

`acl-file` and `new-ca` are for a Mosquitto that Corral does not manage (docs/device-trust.md): the device
ACLs as an `acl_file`, and a CA for device client certificates (`corral devices issue-cert`).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import click

from corral import privatefile
from corral.client.pki import new_ca
from corral.devcluster import files
from corral.devices.accounts import mosquitto_acl_file
from corral.devices.topics import Topics
from corral.privatefile import SecretFileError, read_secret

PASSWORD_ENV = "CORRAL_BROKER_CONTROLLER_PASSWORD"


@click.group()
def broker() -> None:
    """Prepare a Mosquitto broker for Corral (dynamic security plugin)."""


@broker.command("init-dynsec")
@click.option("--file", "path", type=click.Path(dir_okay=False, writable=True, path_type=Path), required=True,
              help="Where to write the plugin's state (its plugin_opt_config_file); replaced if it exists.")
@click.option("--password-file", type=click.Path(dir_okay=False, path_type=Path),
              help="File holding the controller's broker password alone (mode 0600, or 0640 owned by root as a "
                   f"Secret volume mounts it). Without it: the environment variable {PASSWORD_ENV}.")
@click.option("--controller-username", "usernames", multiple=True, metavar="NAME",
              help=f"A controller account to create (repeat it: one per replica, e.g. the StatefulSet's pod names "
                   f"RELEASE-controller-0 .. -N-1); all share the password and the controller's role. "
                   f"Default: {files.BROKER_CONTROLLER} alone.")
def init_dynsec(path: Path, password_file: Path | None, usernames: tuple[str, ...]) -> None:
    """Write the dynamic security plugin's starting state: the controller's accounts only, deny by default.

    The controller's password comes from --password-file (the chart mounts it from a Secret), else from the
    environment variable CORRAL_BROKER_CONTROLLER_PASSWORD. The file is written with mode 0600 (the broker
    reads and rewrites it).
    """
    controllers = usernames or (files.BROKER_CONTROLLER,)
    try:
        files.check_controller_usernames(controllers)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--controller-username") from None
    if password_file is not None:
        try:
            password = read_secret(password_file, "controller's broker password")
        except SecretFileError as err:
            raise click.BadParameter(str(err), param_hint="--password-file") from None
    else:
        password = os.environ.get(PASSWORD_ENV, "")
    if not password:
        raise click.UsageError(f"give the controller's broker password (the account {', '.join(controllers)}) "
                               f"in a file, --password-file FILE, or set {PASSWORD_ENV}")
    state = files.dynsec_config(password, None, tuple(secrets.token_bytes(12) for _ in controllers), controllers)
    write_private(path, (json.dumps(state, indent=1) + "\n").encode())
    which = "account" if len(controllers) == 1 else "accounts"
    click.echo(f"Wrote {path}: {which} {', '.join(controllers)}, deny by default for everyone else.", err=True)


def write_private(path: Path, data: bytes) -> None:
    """privatefile.write_private, or fail with a clear error."""
    try:
        privatefile.write_private(path, data)
    except OSError as err:
        raise click.ClickException(f"cannot write {path}: {err.strerror or err}") from None


@broker.command("acl-file")
@click.option("--topic-prefix", default="iot", show_default=True, help="The prefix of the devices' topics.")
@click.option("--controller-user", "controller_users", multiple=True, metavar="NAME",
              help=f"The controller's username on the broker; repeat it for one account per replica. "
                   f"Default: {files.BROKER_CONTROLLER}.")
def acl_file(topic_prefix: str, controller_users: tuple[str, ...]) -> None:
    """Print the device ACLs as a Mosquitto acl_file, for a broker Corral does not manage.

    Each device may publish only on its own info, status, ack, telemetry and event topics and subscribe only
    to its own cmd topic and the controller's heartbeat; each controller account may use every topic of the
    prefix.
    """
    users = controller_users or (files.BROKER_CONTROLLER,)
    try:
        files.check_controller_usernames(users)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--controller-user") from None
    topics = Topics(topic_prefix)
    text = mosquitto_acl_file(topics, users[0])
    for user in users[1:]:  # the same rule as the first controller's, for each further replica
        text += f"\nuser {user}\ntopic readwrite {topics.prefix}/#\n"
    click.echo(text, nl=False)


@broker.command("new-ca")
@click.option("--out", "directory", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory for ca.crt and ca.key (mode 0600); created if missing.")
@click.option("--name", default="Corral device CA", show_default=True, help="The CA's common name.")
def new_ca_command(directory: Path, name: str) -> None:
    """Make a CA for device client certificates (`corral devices issue-cert`); the broker trusts its ca.crt."""
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "ca.key").exists():
        raise click.ClickException(f"{directory / 'ca.key'} exists: a new CA would orphan every certificate it "
                                   "signed; remove it first if that is what you want")
    ca = new_ca(name)
    write_private(directory / "ca.key", ca.key_pem)
    (directory / "ca.crt").write_bytes(ca.cert_pem)
    click.echo(f"Wrote {directory / 'ca.crt'} (give it to the broker: cafile) and {directory / 'ca.key'} "
               "(keep it safe).", err=True)

"""`corral devices enroll|rotate|revoke|issue-cert|accept-contract|accept-discovered|list`: a person deciding which devices are trusted."""

from __future__ import annotations

from pathlib import Path

import click
import kubernetes

from corral.cli.broker import write_private
from corral.cli.kubeopts import kube_options
from corral.client import bridge as bridging
from corral.client import enroll as enrollment
from corral.client.contracts import AcceptError, accept
from corral.client.enroll import Credential, EnrollmentError
from corral.client.pki import KeyPair, issue
from corral.devices.credentials import CredentialsError, write_credentials

DNS_LABEL_HELP = "lower-case letters, digits and '-', at most 63 characters"


@click.group()
def devices() -> None:
    """Enroll devices (a device is trusted only once a person enrolls it), rotate or revoke their credentials."""


def _hand_out(credentials: list[Credential], write: str | None) -> None:
    if write:
        try:
            write_credentials(write, {c.device_id: c.password for c in credentials})
        except CredentialsError as err:
            raise click.ClickException(str(err)) from None
        click.echo(f"Credentials of {', '.join(c.device_id for c in credentials)} written to {write} (mode 0600); "
                   f"`corral sim --credentials {write}` or the device's configuration takes them.", err=True)
        return
    for c in credentials:
        click.echo(f"device id  {c.device_id}\nusername   {c.username}\npassword   {c.password}")
    click.echo("The device connects with this username and password (its client id is its username). The password "
               "is shown once here and kept in the enrollment Secret.", err=True)


@devices.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--type", "device_type", required=True, help="The device's type or model, e.g. light, lock (a label).")
@click.option("--device-id", help=f"The id in its MQTT topics, if not NAME ({DNS_LABEL_HELP}); one NAME only.")
@click.option("--write", type=click.Path(dir_okay=False), metavar="FILE",
              help="Merge the credentials into FILE (JSON, mode 0600) instead of printing them.")
@kube_options
def enroll(client: kubernetes.client.ApiClient, namespace: str, names: tuple[str, ...], device_type: str,
           device_id: str | None, write: str | None) -> None:
    """Enroll devices NAMES: their Devices and broker credentials, in your name.

    \b
    corral devices enroll porch-light --type light
    corral devices enroll relay-1 relay-2 --type relay --write creds.json
    """
    if device_id and len(names) > 1:
        raise click.UsageError("--device-id names one device: enroll the others separately")
    made = []
    for name in names:
        try:
            made.append(enrollment.enroll(client, namespace, name, device_type, device_id))
        except EnrollmentError as err:
            raise click.ClickException(str(err)) from None
        click.echo(f"Enrolled {name} in {namespace}: Device {name}, Secret {enrollment.secret_name(made[-1].device_id)}.",
                   err=True)
    _hand_out(made, write)


@devices.command()
@click.argument("name")
@click.option("--write", type=click.Path(dir_okay=False), metavar="FILE", help="Merge the new credential into FILE.")
@kube_options
def rotate(client: kubernetes.client.ApiClient, namespace: str, name: str, write: str | None) -> None:
    """Give device NAME a new password; the old one stops working as soon as the controller updates the broker."""
    try:
        credential = enrollment.rotate(client, namespace, name)
    except EnrollmentError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"Rotated the credential of {name} in {namespace}.", err=True)
    _hand_out([credential], write)


@devices.command()
@click.argument("name")
@kube_options
def revoke(client: kubernetes.client.ApiClient, namespace: str, name: str) -> None:
    """Refuse device NAME from now on: the broker disconnects it and refuses it until it is enrolled again."""
    try:
        credential = enrollment.revoke(client, namespace, name)
    except EnrollmentError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"Revoked {name} in {namespace} (device id {credential.device_id}): the controller disables its "
               "broker account, which disconnects it. To trust it again: delete its Secret "
               f"{enrollment.secret_name(credential.device_id)} and enroll it anew.")


@devices.command(name="issue-cert")
@click.argument("name")
@click.option("--ca-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="The CA certificate (PEM), e.g. from `corral broker new-ca`.")
@click.option("--ca-key", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="The CA's private key (PEM, unencrypted).")
@click.option("--out", "directory", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory for DEVICE-ID.crt and DEVICE-ID.key (mode 0600).")
@click.option("--days", type=click.IntRange(min=1, max=3650), default=825, show_default=True,
              help="Validity of the certificate.")
@kube_options
def issue_cert(client: kubernetes.client.ApiClient, namespace: str, name: str, ca_cert: Path, ca_key: Path,
               directory: Path, days: int) -> None:
    """Issue enrolled device NAME a client certificate (CN = its device id), for a broker that authenticates
    devices by certificate (docs/device-trust.md). Revoking the device does not revoke the certificate:
    the broker needs a CRL for that."""
    try:
        credential = enrollment.credential_of_device(client, namespace, name)
    except EnrollmentError as err:
        raise click.ClickException(str(err)) from None
    if credential.revoked:
        raise click.ClickException(f"{name} is revoked: enroll it anew before it gets a certificate")
    try:
        ca = KeyPair(ca_key.read_bytes(), ca_cert.read_bytes())
        pair = issue(ca, credential.device_id, client=True, days=days)
    except (ValueError, TypeError, AssertionError) as err:
        raise click.ClickException(f"cannot sign with {ca_cert} and {ca_key} (an unencrypted EC or RSA key "
                                   f"matching the certificate?): {err}") from None
    directory.mkdir(parents=True, exist_ok=True)
    write_private(directory / f"{credential.device_id}.key", pair.key_pem)
    (directory / f"{credential.device_id}.crt").write_bytes(pair.cert_pem)
    click.echo(f"Wrote {directory / credential.device_id}.crt and .key (CN={credential.device_id}, valid {days} "
               "days): the device presents them to the broker instead of a password.", err=True)


@devices.command(name="accept-contract")
@click.argument("name")
@click.option("--capability", metavar="CAPABILITY",
              help="Accept only if the Device still announces this Capability (the one you looked at).")
@kube_options
def accept_contract(client: kubernetes.client.ApiClient, namespace: str, name: str, capability: str | None) -> None:
    """Trust Device NAME with the changed contract it announces, which asks for more than the accepted one.

    Needs the approve verb on the Device. The controller's risk floors still apply to the accepted contract.
    """
    try:
        accepted = accept(client, namespace, name, capability)
    except AcceptError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"Accepted Capability {accepted.announced} for {name} in {namespace} (it was trusted with "
               f"{accepted.accepted or 'nothing'}).\nThe change: {accepted.reasons}")


@devices.command(name="list")
@kube_options
def list_devices(client: kubernetes.client.ApiClient, namespace: str) -> None:
    """Enrolled devices of the namespace, and whether they are revoked."""
    secrets = kubernetes.client.CoreV1Api(client).list_namespaced_secret(
        namespace, label_selector=enrollment.DEVICE_ID_LABEL).items
    rows = []
    for secret in sorted(secrets, key=lambda s: s.metadata.name):
        credential = enrollment.credential_of(client.sanitize_for_serialization(secret))
        if credential is None:
            continue
        labels = secret.metadata.labels or {}
        rows.append((credential.device, credential.device_id, labels.get(enrollment.DEVICE_TYPE_LABEL, "-"),
                     "revoked" if credential.revoked else "enrolled"))
    if not rows:
        click.echo(f"No enrolled devices in {namespace}.", err=True)
        return
    header = ("DEVICE", "DEVICE-ID", "TYPE", "STATE")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())


@devices.command(name="accept-discovered")
@click.argument("name")
@click.option("--as", "device_name", metavar="DEVICE", help="The Device's name, if not NAME.")
@click.option("--risk", "risks", multiple=True, metavar="ACTUATOR=LEVEL",
              help="Your risk for an actuator (low, medium, high, critical) over the bridge's mapping. Repeatable.")
@click.option("--yes", "-y", is_flag=True, help="Accept without asking (what is accepted is still shown).")
@kube_options
def accept_discovered(client: kubernetes.client.ApiClient, namespace: str, name: str, device_name: str | None,
                      risks: tuple[str, ...], yes: bool) -> None:
    """Accept the bridged candidate NAME (a DiscoveredDevice): make its Device, in your name.

    Shows the contract the bridge derived and what it left out. The Device binds the bridge's unsigned contract only
    if it is exactly this one (its content hash, your risk overrides applied): your acceptance stands in for the
    firmware signature. The broker then lets the device's source publish its state and the bridge its commands.

    \b
    corral devices accept-discovered z2m-0x00124b0024c0ffee -n home --as hall-lamp --risk light=medium
    """
    try:
        shown = bridging.candidate(client, namespace, name, bridging.parse_risks(risks))
    except bridging.BridgeError as err:
        raise click.ClickException(str(err)) from None
    for line in shown.summary():
        click.echo(line)
    if not yes and not click.confirm(f"Accept it as Device {device_name or name} in {namespace}?", default=False):
        raise click.ClickException("nothing accepted")
    try:
        made = bridging.accept_discovered(client, namespace, shown, device_name)
    except bridging.BridgeError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"Accepted {name} as Device {made} in {namespace} (contract hash {shown.accepted_hash[:16]}). The "
               f"controller binds the bridge's contract once it announces this one.")

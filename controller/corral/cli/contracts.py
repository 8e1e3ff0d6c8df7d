"""`corral contracts keygen` and `corral contracts sign`: sign device contracts so a controller that requires
signatures (the chart's default) accepts them.

The build step of a firmware release: a vendor keeps one private key, signs each device type's contract once
per release (the signature covers the type's contract, not a device id) and gives the controller the public
key in a Secret. The files and the Secret are `client.signing`; heavy imports wait until a command runs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


@click.group()
def contracts() -> None:
    """Sign device contracts (signing keys, signed firmware builds)."""


@contracts.command("keygen")
@click.option("--key", "key_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Write the new Ed25519 private key here (PEM, mode 0600). An existing file is never replaced.")
@click.option("--public", "public_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the public key (PEM) here, e.g. for "
                   "`kubectl create secret generic corral-signing-keys --from-file=vendor=FILE`.")
@click.option("--secret", metavar="NAMESPACE/NAME",
              help="Trust the key at once: add it to this Secret of trusted keys (made if missing; other entries "
                   "stay), the one `corral run --signing-keys` and the chart's signing.keysSecret name.")
@click.option("--entry", default="vendor", show_default=True,
              help="The key's data entry in --secret: its name in the controller's refusals and Events.")
@click.option("--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig file for --secret (default: $KUBECONFIG, ~/.kube/config).")
@click.option("--context", help="Kubeconfig context for --secret.")
def keygen(key_path: Path, public_path: Path | None, secret: str | None, entry: str, kubeconfig: str | None,
           context: str | None) -> None:
    """Make a contract signing key; print its public half (PEM) on stdout.

    \b
    corral contracts keygen --key vendor.pem --public vendor.pub
    corral contracts keygen --key vendor.pem --secret corral/corral-signing-keys

    Keep the private key off the cluster (whoever holds it can vouch for any contract); only its public half
    goes into the Secret.
    """
    from corral.client.signing import SigningError, new_key
    from corral.contract.signature import public_pem

    namespace, name = _secret_name(secret) if secret else ("", "")
    try:
        key = new_key(key_path)
    except SigningError as err:
        raise click.ClickException(str(err)) from None
    pem = public_pem(key)
    if public_path is not None:
        public_path.write_bytes(pem)
    click.echo(f"wrote the private key {key_path} (0600)" + (f" and the public key {public_path}" if public_path else ""),
               err=True)
    if secret:
        _trust(kubeconfig, context, namespace, name, entry, key)
        click.echo(f"trusted as entry {entry!r} of Secret {namespace}/{name}: corral run --require-signatures "
                   f"--signing-keys {namespace}/{name}", err=True)
    sys.stdout.write(pem.decode())


def _secret_name(value: str) -> tuple[str, str]:
    namespace, slash, name = value.partition("/")
    if not slash or not namespace or not name or "/" in name:
        raise click.BadParameter(f"{value!r} is not NAMESPACE/NAME", param_hint="--secret")
    return namespace, name


def _trust(kubeconfig: str | None, context: str | None, namespace: str, name: str, entry: str,
           key: Ed25519PrivateKey) -> None:
    import kubernetes

    from corral.cli.kubeopts import connect
    from corral.client.errors import api_message
    from corral.client.signing import SigningError, trust_key

    client, _ = connect(kubeconfig, context, namespace)
    try:
        trust_key(client, namespace, name, entry, key)
    except SigningError as err:
        raise click.ClickException(str(err)) from None
    except kubernetes.client.ApiException as err:
        raise click.ClickException(f"the API server refused to write Secret {namespace}/{name}: {err.status} "
                                   f"{err.reason}: {api_message(err)}") from None


@contracts.command("sign")
@click.argument("contracts_to_sign", metavar="[TYPE|FILE.json]...", nargs=-1)
@click.option("--key", "key_path", required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="The Ed25519 private key (`corral contracts keygen`), mode 0600.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the signed build here (default: stdout).")
def sign(contracts_to_sign: tuple[str, ...], key_path: Path, out_path: Path | None) -> None:
    """Sign contracts: device types of the catalog (all of them when none is named) or contract JSON files.

    Writes a signed build: a JSON object mapping each device type (a file's name without .json) to its contract
    with `signature` set, which the firmware embeds. Every contract must carry a `version` (raised with each
    signed release): a controller that requires signatures refuses one older than it accepted.

    \b
    corral contracts sign --key vendor.pem --out signed.json          # the whole catalog
    corral contracts sign lock env_fan --key vendor.pem
    corral contracts sign ./acme-light.json --key vendor.pem
    corral sim --preset home --signed-contracts signed.json ...        # the catalog's firmware, signed
    """
    from corral.client.signing import SigningError, read_key, sign_file, sign_types, write_build

    try:
        key = read_key(key_path)
        files = [Path(c) for c in contracts_to_sign if c.endswith(".json") or Path(c).is_file()]
        types = [c for c in contracts_to_sign if Path(c) not in files]
        build = sign_types(types, key) if types or not files else {}
        for path in files:
            device_type, signed = sign_file(path, key)
            build[device_type] = signed
    except SigningError as err:
        raise click.ClickException(str(err)) from None
    if out_path is None:
        import json

        sys.stdout.write(json.dumps(build, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        return
    write_build(out_path, build)
    click.echo(f"signed {len(build)} contract(s) ({', '.join(sorted(build))}) into {out_path}", err=True)

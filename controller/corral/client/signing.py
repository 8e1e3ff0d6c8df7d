"""Contract signing as a vendor (or the demo) does it: a key file, signed builds, the trusted-keys Secret.

The pure part (what a signature covers, signing, checking) is `contract.signature`; this module keeps the files
and the Secret. A signed build is a JSON file mapping each device type to its contract with `signature` set:
what the firmware embeds (`corral sim --signed-contracts FILE` runs the catalog's firmware with it; a board loads
its type's entry). The controller trusts the public keys in a Secret (`corral run --signing-keys NS/NAME`, chart
`signing.keysSecret`), one data entry per key, so a second key can be added before the first is retired.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.contract.signature import load_private_key, private_pem, public_pem, signed_contract
from corral.privatefile import SecretFileError, read_private, write_private

if TYPE_CHECKING:
    import kubernetes
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

FIELD_MANAGER = "corral-contracts"


class SigningError(Exception):
    """A key, a contract or a signed build that cannot be used, said so that a person knows what to do."""


def new_key(path: Path) -> Ed25519PrivateKey:
    """Make a signing key in `path` (PEM, PKCS8, mode 0600); an existing file is never replaced."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if path.exists():
        raise SigningError(f"{path} exists: a new key there would orphan every contract signed with the old one. "
                           "Give another path, or remove the file yourself first")
    key = Ed25519PrivateKey.generate()
    write_private(path, private_pem(key))
    return key


def ensure_key(path: Path) -> Ed25519PrivateKey:
    """The key in `path`, made first if there is none (the demo keeps one in its state directory)."""
    return read_key(path) if path.exists() else new_key(path)


def read_key(path: Path) -> Ed25519PrivateKey:
    try:
        text = read_private(path, "signing key")
    except SecretFileError as err:
        raise SigningError(str(err)) from None
    try:
        return load_private_key(text)
    except ValueError as err:
        raise SigningError(f"{path}: {err}") from None


def sign_types(device_types: list[str], key: Ed25519PrivateKey) -> dict[str, dict[str, Any]]:
    """The catalog's contracts of these types (all of them when empty), signed."""
    from corral_sim.catalog import CatalogError, contract_for, normalize_type
    from corral_sim.catalog import device_types as catalog_types

    try:
        names = [normalize_type(t) for t in device_types] if device_types else list(catalog_types())
        return {name: _sign(contract_for(name), key, f"device type {name}") for name in names}
    except CatalogError as err:
        raise SigningError(str(err)) from None


def sign_file(path: Path, key: Ed25519PrivateKey) -> tuple[str, dict[str, Any]]:
    """A contract JSON file, signed; its type is the file's name without .json (as in firmware/devices/)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SigningError(f"{path}: not a readable JSON file: {err}") from None
    if not isinstance(data, dict):
        raise SigningError(f"{path}: a contract file holds one JSON object")
    return path.stem, _sign(data, key, str(path))


def _sign(data: dict[str, Any], key: Ed25519PrivateKey, what: str) -> dict[str, Any]:
    try:
        return signed_contract(data, key)
    except ValueError as err:
        raise SigningError(f"{what}: {err}") from None


def write_build(path: Path, build: dict[str, dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(build, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def firmware_contracts(path: Path) -> dict[str, dict[str, Any]]:
    """The signed build in `path` for the catalog's firmware: device type -> signed contract. Each must be the
    catalog's contract plus its signature: the simulator runs the catalog's firmware, so a build of another
    contract (an older catalog, an edited file) is refused here instead of by every device's controller."""
    from corral_sim.catalog import CatalogError, contract_for, normalize_type

    try:
        build = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SigningError(f"{path}: not a readable JSON file: {err}") from None
    if not isinstance(build, dict) or not all(isinstance(v, dict) for v in build.values()):
        raise SigningError(f"{path}: a signed build maps device types to signed contracts "
                           "(`corral contracts sign --out FILE` writes one)")
    contracts = {}
    for device_type, signed in build.items():
        try:
            name = normalize_type(device_type)
        except CatalogError as err:
            raise SigningError(f"{path}: {err}") from None
        unsigned = {k: v for k, v in signed.items() if k != "signature"}
        if not signed.get("signature"):
            raise SigningError(f"{path}: the contract of {name} carries no signature")
        if unsigned != contract_for(name):
            differ = sorted(k for k in set(unsigned) | set(contract_for(name))
                            if unsigned.get(k) != contract_for(name).get(k))
            raise SigningError(f"{path}: the signed contract of {name} is not the catalog's (differs in "
                               f"{', '.join(differ)}): sign the catalog again (corral contracts sign --out {path})")
        contracts[name] = signed
    return contracts


def trust_key(client: kubernetes.client.ApiClient, namespace: str, name: str, entry: str,
              key: Ed25519PrivateKey, replace: bool = False) -> None:
    """Add the public half of `key` to the trusted-keys Secret as data entry `entry`, creating the Secret if
    needed; other entries stay. An entry that holds another key is replaced only with `replace` (the demo's own
    entry): replacing a trusted key refuses every device signed with the old one. Nothing is written when the
    entry already holds this key.

    A merge patch of the one entry, not a server-side apply: an apply that names one entry would remove the
    entries this same field manager added before (a second key, added for a rotation)."""
    import base64

    import kubernetes as k8s

    core = k8s.client.CoreV1Api(client)
    value = base64.b64encode(public_pem(key)).decode()
    try:
        held = (core.read_namespaced_secret(name, namespace).data or {}).get(entry)
    except k8s.client.ApiException as err:
        if err.status != 404:
            raise
        body = {"metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "corral"}}, "type": "Opaque",
                "data": {entry: value}}
        try:
            core.create_namespaced_secret(namespace, body, field_manager=FIELD_MANAGER)
            return
        except k8s.client.ApiException as created:
            if created.status != 409:  # made by someone else meanwhile: add the entry to theirs
                raise
        held = (core.read_namespaced_secret(name, namespace).data or {}).get(entry)
    if held == value:
        return
    if held is not None and not replace:
        raise SigningError(f"Secret {namespace}/{name} already trusts another key as {entry!r}: choose another entry "
                           "name (--entry; both keys are then trusted, so devices signed with the old one keep "
                           "working), or remove that entry first if its key is retired")
    core.patch_namespaced_secret(name, namespace, {"data": {entry: value}}, field_manager=FIELD_MANAGER,
                                 _content_type="application/merge-patch+json")

"""A serving certificate for the local plane, when none is given: a CA of its own and a certificate for
localhost, made once and kept (`serving-ca.crt` is what a client trusts: `corral audit --ca-file`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from corral.client.pki import issue, new_ca
from corral.privatefile import write_private


@dataclass(frozen=True)
class ServingFiles:
    cert_file: Path
    key_file: Path
    ca_file: Path


def ensure_serving_certificate(directory: Path) -> ServingFiles:
    files = ServingFiles(directory / "serving.crt", directory / "serving.key", directory / "serving-ca.crt")
    if files.cert_file.exists() and files.key_file.exists() and files.ca_file.exists():
        return files
    ca = new_ca("corral-controller-serving-ca")
    pair = issue(ca, "corral-controller", server_names=("localhost", "127.0.0.1", "::1"))
    directory.mkdir(parents=True, exist_ok=True)
    write_private(files.key_file, pair.key_pem)
    files.cert_file.write_bytes(pair.cert_pem)
    files.ca_file.write_bytes(ca.cert_pem)
    return files

"""A serving certificate for the local plane, when none is given: a CA of its own and a certificate for
localhost, made once and kept (`serving-ca.crt` is what a client trusts: `corral audit --ca-file`).

The certificate is also for `corral-readings.corral-system.svc`: the name kube-apiserver's aggregator checks
when it proxies the readings APIService to this server (it verifies an APIService's backend as
`SERVICE.NAMESPACE.svc`, whatever address the Service resolves to; corral.devcluster.readings_api). A kept
certificate without one of these names is made again, with a new CA."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from corral.client.pki import issue, new_ca
from corral.privatefile import write_private

# The Service the local plane's readings APIService points at (namespace, name).
AGGREGATED_SERVICE = ("corral-system", "corral-readings")
SERVER_NAMES = ("localhost", "127.0.0.1", "::1", f"{AGGREGATED_SERVICE[1]}.{AGGREGATED_SERVICE[0]}.svc")


@dataclass(frozen=True)
class ServingFiles:
    cert_file: Path
    key_file: Path
    ca_file: Path


def ensure_serving_certificate(directory: Path) -> ServingFiles:
    files = ServingFiles(directory / "serving.crt", directory / "serving.key", directory / "serving-ca.crt")
    if files.cert_file.exists() and files.key_file.exists() and files.ca_file.exists() \
            and _names_of(files.cert_file) >= set(SERVER_NAMES):
        return files
    ca = new_ca("corral-controller-serving-ca")
    pair = issue(ca, "corral-controller", server_names=SERVER_NAMES)
    directory.mkdir(parents=True, exist_ok=True)
    write_private(files.key_file, pair.key_pem)
    files.cert_file.write_bytes(pair.cert_pem)
    files.ca_file.write_bytes(ca.cert_pem)
    return files


def _names_of(cert_file: Path) -> set[str]:
    """The DNS names and IP addresses a certificate is for; none when it cannot be read."""
    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return set()
    return {*names.get_values_for_type(x509.DNSName), *(str(ip) for ip in names.get_values_for_type(x509.IPAddress))}

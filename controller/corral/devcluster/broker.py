"""The local broker's files: its configuration, the dynamic security plugin's starting state, and a CA with
the broker's TLS certificate.

Used by `corral dev up`, by `corral demo --kubeconfig` (a private broker) and by tests and benchmarks that
run a broker of their own. The CA and the server certificate are made once per directory and kept; the
plugin's state is written fresh each time the broker starts (the broker keeps no persistence): the
controller re-establishes every device's account from the enrollment Secrets when it connects. The controller
has four accounts, `corral-controller` and `corral-controller-1` to `-3` (files.LOCAL_CONTROLLER_ACCOUNTS), one
per replica a test runs, all with the controller's password and role.
"""

from __future__ import annotations

import glob
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from corral.client.pki import KeyPair, issue, new_ca
from corral.devcluster import files
from corral.devcluster.errors import DevClusterError
from corral.privatefile import write_private

_PLUGIN_PATTERNS = ("/usr/lib/*/mosquitto_dynamic_security.so", "/usr/lib/mosquitto_dynamic_security.so",
                    "/usr/local/lib/mosquitto_dynamic_security.so")


@dataclass(frozen=True)
class BrokerFiles:
    conf: Path
    ca_file: Path
    controller_password: str
    admin_password: str


def plugin_path() -> str:
    override = os.environ.get("CORRAL_MOSQUITTO_DYNSEC")
    if override:
        return override
    for pattern in _PLUGIN_PATTERNS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    raise DevClusterError("Mosquitto's dynamic security plugin (mosquitto_dynamic_security.so) was not found; it "
                          "ships with Debian's mosquitto 2.0 package, or point CORRAL_MOSQUITTO_DYNSEC at it")


def new_passwords() -> dict[str, str]:
    return {"controller": secrets.token_urlsafe(24), "admin": secrets.token_urlsafe(24)}


def password_file(directory: Path, who: str) -> Path:
    """Where prepare() keeps the password of the account `who` (one of files.LOCAL_CONTROLLER_ACCOUNTS or BROKER_ADMIN), for
    `--mqtt-password-file`: a process that connects as it reads it there, never from its arguments."""
    return directory / f"{who}.password"


def debug_log(directory: Path) -> Path:
    """The broker's log, at debug level: what `corral run --broker-log` reads for refused PUBLISHes (and keeps
    small: devices.refusals cuts it once read)."""
    return directory / "mosquitto-debug.log"


def certificates(directory: Path) -> files.BrokerTls:
    """The broker's CA and server certificate in directory/tls, made on first use (tls.port is filled later)."""
    tls = directory / "tls"
    tls.mkdir(parents=True, exist_ok=True)
    ca_file, cert_file, key_file = tls / "ca.crt", tls / "broker.crt", tls / "broker.key"
    if not (ca_file.exists() and cert_file.exists() and key_file.exists()):
        ca = new_ca("Corral local broker CA")
        server = issue(ca, "localhost", server_names=("localhost", "127.0.0.1", "::1"))
        write_private(tls / "ca.key", ca.key_pem)
        ca_file.write_bytes(ca.cert_pem)
        cert_file.write_bytes(server.cert_pem)
        write_private(key_file, server.key_pem)
    return files.BrokerTls(0, ca_file, cert_file, key_file)


def device_ca(directory: Path) -> KeyPair:
    """The CA that signs device client certificates (for brokers that authenticate devices by certificate)."""
    tls = directory / "tls"
    return KeyPair((tls / "ca.key").read_bytes(), (tls / "ca.crt").read_bytes())


def prepare(directory: Path, port: int, tls_port: int, passwords: dict[str, str]) -> BrokerFiles:
    """Write what the broker starts with; returns where its configuration is."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)  # the accounts' passwords and the CA's key are in here
    tls = certificates(directory)
    tls = files.BrokerTls(tls_port, tls.ca_file, tls.cert_file, tls.key_file)
    dynsec = directory / "dynamic-security.json"
    controllers = files.LOCAL_CONTROLLER_ACCOUNTS
    state = files.dynsec_config(passwords["controller"], passwords["admin"],
                                tuple(secrets.token_bytes(12) for _ in range(len(controllers) + 1)), controllers)
    write_private(dynsec, json.dumps(state, indent=1).encode())
    for name in controllers:  # the replicas' accounts share the controller's password
        write_private(password_file(directory, name), passwords["controller"] + "\n")
    write_private(password_file(directory, files.BROKER_ADMIN), passwords["admin"] + "\n")
    conf = directory / "mosquitto.conf"
    conf.write_text(files.mosquitto_conf(port, plugin_path(), dynsec, tls, debug_log(directory)))
    return BrokerFiles(conf, tls.ca_file, passwords["controller"], passwords["admin"])

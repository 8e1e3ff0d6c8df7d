"""The files a running plane leaves for people and scripts: kubeconfig, env, token list, broker config.

Pure rendering, kept apart from process handling so it can be tested without
starting anything.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

CLUSTER_NAME = "corral-dev"
ADMIN_USER = "corral-admin"
DEV_USER = "corral-dev-user"
ADMIN_CONTEXT = "corral-dev"
DEV_USER_CONTEXT = "corral-dev-user"


def token_auth_csv(admin_token: str, user_token: str) -> str:
    """kube-apiserver --token-auth-file: token,user,uid,"groups".

    The admin is in system:masters (RBAC is bypassed for that group); the dev
    user is in no group besides system:authenticated, so it starts with no
    rights: the identity that permission tests grant things to.
    """
    return f'{admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n{user_token},{DEV_USER},{DEV_USER}\n'


def kubeconfig(server: str, ca_pem: bytes, admin_token: str, user_token: str) -> str:
    ca_data = base64.b64encode(ca_pem).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CLUSTER_NAME, "cluster": {"server": server, "certificate-authority-data": ca_data}}],
        "users": [
            {"name": ADMIN_USER, "user": {"token": admin_token}},
            {"name": DEV_USER, "user": {"token": user_token}},
        ],
        "contexts": [
            {"name": ADMIN_CONTEXT, "context": {"cluster": CLUSTER_NAME, "user": ADMIN_USER}},
            {"name": DEV_USER_CONTEXT, "context": {"cluster": CLUSTER_NAME, "user": DEV_USER}},
        ],
        "current-context": ADMIN_CONTEXT,
        "preferences": {},
    }
    return yaml.safe_dump(config, sort_keys=False)


def env_file(kubeconfig_path: Path, mqtt_url: str, mqtt_password_file: Path, kubectl_dir: Path,
             mqtt_ca: Path | None = None, broker_log: Path | None = None) -> str:
    """Shell assignments for `source .corral/dev/env`.

    No credential in it: whatever a shell exports, every process it starts inherits, and a process's
    environment is one more place a secret leaks from. CORRAL_MQTT_URL names the controller's broker account
    without its password; CORRAL_MQTT_PASSWORD_FILE is where `corral run` reads that (mode 0600). PATH gains
    the directory of the kubectl built with the plane, because the system kubectl may be more than one minor
    version away from the server. CORRAL_BROKER_LOG is the broker's debug log, where `corral run` reads
    the PUBLISHes it refused (and which it keeps small).
    """
    if urlsplit(mqtt_url).password is not None:
        raise ValueError("the env file exports no password: pass the broker URL with its username only")
    lines = [
        "# Written by `corral dev up`. Use: source .corral/dev/env",
        f"export KUBECONFIG={shlex.quote(str(kubeconfig_path))}",
        f"export CORRAL_MQTT_URL={shlex.quote(mqtt_url)}",
        f"export CORRAL_MQTT_PASSWORD_FILE={shlex.quote(str(mqtt_password_file))}",
        f'export PATH={shlex.quote(str(kubectl_dir))}:"$PATH"',
    ]
    if mqtt_ca is not None:
        lines.insert(4, f"export CORRAL_MQTT_CA={shlex.quote(str(mqtt_ca))}")
    if broker_log is not None:
        lines.insert(-1, f"export CORRAL_BROKER_LOG={shlex.quote(str(broker_log))}")
    return "\n".join(lines) + "\n"


# The broker's own identities. Devices get theirs at enrollment (one per device, managed by the controller).
BROKER_CONTROLLER = "corral-controller"
BROKER_ADMIN = "corral-admin"
# Controller replicas each connect with an account of their own (the client id is the username, so replicas
# sharing one would knock each other off the broker). The local plane holds these beside `corral-controller`, with
# its password and role, so a test can run up to four controllers; the chart names one per StatefulSet ordinal
# (`corral broker init-dynsec --controller-username`).
LOCAL_CONTROLLER_REPLICAS = tuple(f"{BROKER_CONTROLLER}-{n}" for n in (1, 2, 3))
LOCAL_CONTROLLER_ACCOUNTS = (BROKER_CONTROLLER, *LOCAL_CONTROLLER_REPLICAS)
# A broker username that is also a client id and a pod name: a DNS-label-like word, no MQTT wildcard or level.
CONTROLLER_USERNAME_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$"
DYNSEC_ITERATIONS = 101  # what mosquitto_ctrl uses


@dataclass(frozen=True)
class BrokerTls:
    port: int
    ca_file: Path
    cert_file: Path
    key_file: Path


# The largest packet the broker takes from a client; a bigger one disconnects the client. The largest contract
# the catalog ships is under 2 KiB and the controller refuses any message over 64 KiB (devices.messages), so
# 256 KiB leaves room for any contract the controller could accept, and the chart sets the same number.
MAX_PACKET_SIZE = 262144


def mosquitto_conf(port: int, plugin: str = "", dynsec_file: Path | None = None, tls: BrokerTls | None = None,
                   debug_log: Path | None = None) -> str:
    """A loopback broker that admits no anonymous client: every client is an account of the dynamic security
    plugin (`plugin`, its state in `dynsec_file`), with the username as its client id so no identity can take
    over another's session. Optionally a second listener that serves TLS.

    `debug_log`: the broker logs at debug level to this file instead of stdout. The debug log is the only place
    Mosquitto 2.0 names a PUBLISH its ACLs refused ("Denied PUBLISH from CLIENT (... 'TOPIC' ...)"); the
    controller reads it (`corral run --broker-log`) to record and tell who tried (devices.refusals). A file,
    not stdout: Mosquitto writes a file line by line, but stdout into a pipe or file in blocks, hours late
    at a home's pace. Its cost: bench/broker_debug_log.py, docs/device-trust.md."""
    lines = [
        "# Written by `corral dev up`: a loopback-only broker for development and tests.",
        "per_listener_settings false",
        "allow_anonymous false",
    ]
    if plugin and dynsec_file is not None:
        lines += [f"plugin {plugin}", f"plugin_opt_config_file {dynsec_file}"]
    lines += [f"listener {port} 127.0.0.1", "use_username_as_clientid true"]
    if tls is not None:
        lines += [f"listener {tls.port} 127.0.0.1", "use_username_as_clientid true",
                  f"cafile {tls.ca_file}", f"certfile {tls.cert_file}", f"keyfile {tls.key_file}",
                  "tls_version tlsv1.2"]
    lines += [
        "persistence false",
        # Small command/ack messages would otherwise wait on Nagle's algorithm (tens of ms at p99).
        "set_tcp_nodelay true",
        # On (re)connect the controller receives every device's retained info and status at once: two
        # messages per device. Mosquitto's default queue (1000 QoS 1 messages per client) would drop
        # the statuses of a fleet beyond ~500 devices.
        "max_queued_messages 100000",
        f"max_packet_size {MAX_PACKET_SIZE}",
        *([f"log_dest file {debug_log}", "log_type debug"] if debug_log is not None else ["log_dest stdout"]),
        "log_type error",
        "log_type warning",
        "log_type notice",
        "log_timestamp_format %Y-%m-%dT%H:%M:%S",
        # Started as root, Mosquitto would switch to a `mosquitto` user that may
        # not exist on a dev machine; stay whoever started it.
        f"user {getpass.getuser()}",
    ]
    return "\n".join(lines) + "\n"


def dynsec_password(password: str, salt: bytes, iterations: int = DYNSEC_ITERATIONS) -> dict[str, Any]:
    """A password as the dynamic security plugin stores it: PBKDF2-HMAC-SHA512, base64."""
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    return {"password": base64.b64encode(digest).decode(), "salt": base64.b64encode(salt).decode(),
            "iterations": iterations}


def check_controller_usernames(names: Sequence[str]) -> None:
    """Raise ValueError saying what is wrong unless `names` are one or more distinct controller usernames."""
    if not names:
        raise ValueError("at least one controller account is needed")
    for name in names:
        if not re.fullmatch(CONTROLLER_USERNAME_PATTERN, name):
            raise ValueError(f"bad controller username {name!r}: 1-253 letters, digits, '.', '_' or '-', starting and "
                             "ending with a letter or digit (it is also the MQTT client id and, in the chart, the pod name)")
        if name == BROKER_ADMIN:
            raise ValueError(f"{BROKER_ADMIN!r} is the local plane's admin account, not a controller's")
    repeated = sorted({name for name in names if list(names).count(name) > 1})
    if repeated:
        raise ValueError(f"controller username given twice: {', '.join(repeated)}")


def _everything(topics: list[str]) -> list[dict[str, Any]]:
    return [{"acltype": acltype, "topic": topic, "allow": True}
            for topic in topics
            for acltype in ("publishClientSend", "publishClientReceive", "subscribePattern", "unsubscribePattern")]


# What the controller does on the broker, under any topic prefix of one to PREFIX_LEVELS levels (tests run
# many controllers with prefixes of their own on one broker; a chart may use home/iot): run the dynamic
# security plugin, send commands and heartbeats, and hear what devices publish. Nothing else: its account
# cannot speak as a device (no info, status, ack, telemetry or event of its own) nor listen to other
# clients' traffic beyond the device protocol.
PREFIX_LEVELS = 3


def _under_any_prefix(*suffixes: str) -> tuple[str, ...]:
    return tuple("/".join(["+"] * levels + [suffix]) for suffix in suffixes for levels in range(1, PREFIX_LEVELS + 1))


CONTROLLER_SENDS = ("$CONTROL/dynamic-security/v1", *_under_any_prefix("+/cmd", "_corral/heartbeat"))
CONTROLLER_HEARS = ("$CONTROL/dynamic-security/v1/response",
                    *_under_any_prefix(*(f"+/{kind}" for kind in ("info", "status", "ack", "telemetry", "event"))))


def controller_acls() -> list[dict[str, Any]]:
    # The plugin's answers need their own receive rule: the default allows receiving ordinary topics only.
    return ([{"acltype": "publishClientSend", "topic": topic, "allow": True} for topic in CONTROLLER_SENDS]
            + [{"acltype": "subscribePattern", "topic": topic, "allow": True} for topic in CONTROLLER_HEARS]
            + [{"acltype": "publishClientReceive", "topic": CONTROLLER_HEARS[0], "allow": True}])


def dynsec_config(controller_password: str, admin_password: str | None, salts: tuple[bytes, ...],
                  controllers: Sequence[str] = (BROKER_CONTROLLER,)) -> dict[str, Any]:
    """The plugin's starting state: the controllers' accounts (and, given a password, the admin's) and nothing
    for anyone else (deny by default). `controllers`: the usernames of the controller replicas, each with
    `controller_password` and the controller's role. `salts`: one per account, the controllers' in order, then
    the admin's.

    The controller may run the plugin (it creates one account and one role per enrolled device), send
    commands and heartbeats and hear devices (controller_acls), under a prefix of up to three levels. The admin
    is the broker's `system:masters`, for people and tests that inspect or play devices; a broker in a
    cluster (the chart's, `corral broker init-dynsec`) has none.
    """
    check_controller_usernames(controllers)
    accounts = len(controllers) + (admin_password is not None)
    if len(salts) < accounts:
        raise ValueError(f"dynsec_config needs one salt per account: {accounts} accounts, {len(salts)} salts")
    control = ["$CONTROL/dynamic-security/#"]
    # No textdescription: the device-account sync (devices.accounts) deletes only clients it marked as its own.
    clients = [{"username": name, "textName": "Corral controller", "roles": [{"rolename": BROKER_CONTROLLER}],
                **dynsec_password(controller_password, salt)} for name, salt in zip(controllers, salts, strict=False)]
    roles = [{"rolename": BROKER_CONTROLLER, "acls": controller_acls()}]
    if admin_password is not None:
        clients.append({"username": BROKER_ADMIN, "textName": "Corral local plane admin",
                        "roles": [{"rolename": BROKER_ADMIN}], **dynsec_password(admin_password, salts[len(controllers)])})
        roles.append({"rolename": BROKER_ADMIN, "acls": _everything([*control, "#"])})
    return {
        "defaultACLAccess": {"publishClientSend": False, "publishClientReceive": True, "subscribe": False,
                             "unsubscribe": True},
        "clients": clients,
        "groups": [],
        "roles": roles,
    }


# Kubernetes' own audit, beside Corral's Events: who wrote which Intent, Approval or Device (its target, an
# accepted contract, its status), with the request and response bodies as the API server saw them. Nothing
# else is recorded; reads are not. The chart README shows this same text for k3s (a unit test keeps them equal).
_KUBE_AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
# Status, which only the controller writes, many times a minute: who and when, not the bodies (the
# controller's own audit log has the facts).
- level: Metadata
  verbs: [update, patch]
  resources:
  - group: corral.dev
    resources: [devices/status, intents/status, approvals/status, capabilities/status, auditcheckpoints/status]
# Every other write to Corral's resources (Devices and their targets, Intents, Approvals, Capabilities,
# AuditCheckpoints), with its bodies.
- level: RequestResponse
  verbs: [create, update, patch, delete, deletecollection]
  resources:
  - group: corral.dev
# Nothing else.
- level: None
"""


def kube_audit_policy() -> str:
    """kube-apiserver --audit-policy-file: writes to group corral.dev at RequestResponse (status at Metadata),
    nothing else."""
    return _KUBE_AUDIT_POLICY

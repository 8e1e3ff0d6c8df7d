"""The files a running plane leaves for people and scripts: kubeconfig, env, token list, broker config.

Pure rendering, kept apart from process handling so it can be tested without
starting anything.
"""

from __future__ import annotations

import base64
import getpass
import shlex
from pathlib import Path

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


def env_file(kubeconfig_path: Path, mqtt_url: str, kubectl_dir: Path) -> str:
    """Shell assignments for `source .corral/dev/env`.

    PATH gains the directory of the kubectl built with the plane, because the
    system kubectl may be more than one minor version away from the server.
    """
    lines = [
        "# Written by `corral dev up`. Use: source .corral/dev/env",
        f"export KUBECONFIG={shlex.quote(str(kubeconfig_path))}",
        f"export CORRAL_MQTT_URL={shlex.quote(mqtt_url)}",
        f'export PATH={shlex.quote(str(kubectl_dir))}:"$PATH"',
    ]
    return "\n".join(lines) + "\n"


def mosquitto_conf(port: int) -> str:
    lines = [
        "# Written by `corral dev up`: a loopback-only broker for development and tests.",
        f"listener {port} 127.0.0.1",
        "allow_anonymous true",
        "persistence false",
        # Small command/ack messages would otherwise wait on Nagle's algorithm (tens of ms at p99).
        "set_tcp_nodelay true",
        # On (re)connect the controller receives every device's retained info and status at once: two
        # messages per device. Mosquitto's default queue (1000 QoS 1 messages per client) would drop
        # the statuses of a fleet beyond ~500 devices.
        "max_queued_messages 100000",
        "log_dest stdout",
        "log_type error",
        "log_type warning",
        "log_type notice",
        "log_timestamp_format %Y-%m-%dT%H:%M:%S",
        # Started as root, Mosquitto would switch to a `mosquitto` user that may
        # not exist on a dev machine; stay whoever started it.
        f"user {getpass.getuser()}",
    ]
    return "\n".join(lines) + "\n"

"""What a caller who can see no device is told, and what to ask their operator for.

An agent whose ServiceAccount has no RoleBinding gets an empty tool list. Telling it to "start with
iot.list_devices" sends it to a tool it does not have ("Unknown tool"), and nothing tells it or the person
running it why. This names the two possible causes and, for the rights, the exact RoleBinding to create.
"""

from __future__ import annotations

import re
import shlex

SERVICE_ACCOUNT = re.compile(r"^system:serviceaccount:([a-z0-9-]+):([a-z0-9.-]+)$")
OPERATOR_ROLE = "corral-agent-operator"  # read and act (api/roles.py); corral-agent-reader only reads
READER_ROLE = "corral-agent-reader"


def binding_commands(username: str | None, namespaces: list[str]) -> list[str]:
    """The kubectl command, per namespace, that gives this caller the agent-operator role there."""
    if username is None:
        return [f"kubectl create rolebinding corral-agent --clusterrole={OPERATOR_ROLE} --user=USERNAME -n {ns}"
                for ns in namespaces]
    account = SERVICE_ACCOUNT.match(username)
    name = account.group(2) if account else re.sub(r"[^a-z0-9]+", "-", username.lower()).strip("-")[:40] or "user"
    subject = f"--serviceaccount={account.group(1)}:{account.group(2)}" if account else \
        f"--user={shlex.quote(username)}"
    return [f"kubectl create rolebinding corral-agent-{name} --clusterrole={OPERATOR_ROLE} {subject} -n {ns}"
            for ns in namespaces]


def nothing_visible_note(username: str | None, namespaces: list[str]) -> str:
    who = username or "this caller"
    where = ", ".join(namespaces)
    commands = "; ".join(binding_commands(username, namespaces))
    return (f"Note: {who} sees no devices in namespace(s) {where}, so it has no tools to call. Either its Kubernetes "
            "rights do not cover the devices there (it needs get/list and the 'read' verb on devices), or none are "
            "there. Tell the user to ask their operator for a role, e.g. "
            f"`{commands}` ({READER_ROLE} to read only), or to start the gateway with -n for the namespace where "
            "the devices are.")

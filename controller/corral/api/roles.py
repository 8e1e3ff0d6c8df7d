"""The three user roles of DESIGN.md, as ClusterRoles to bind per namespace, plus read access to contracts.

The Helm chart ships the same rules (charts/corral/templates/user-roles.yaml; a test keeps them equal);
`corral demo` applies these. Agents never get `patch` on devices: editing spec.target directly would
bypass Intents, approvals and the audit trail; the overlay has a verb of its own (`annotate`), which an
overlay Intent needs.

Rules (api/rule.py) act later, without the agent: writing one is a standing delegation, so it is a role of its own
(`agent-rule-writer`), bound beside agent-operator only to the agents a person wants writing Rules; the other
agent roles may read Rules. Naming a ServiceAccount in a Rule needs the `use` (or `impersonate`) verb on that
ServiceAccount, which no role here grants: a person binds it per ServiceAccount (docs/rules-governance.md).
An agent's revision acts only once a person accepts it: the `approve` verb on rules, which the approver role has.
"""

from __future__ import annotations

from typing import Any

from corral.api.codes import GROUP, READINGS_GROUP


def _rule(group: str, resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": resources, "verbs": verbs}


USER_ROLE_RULES: dict[str, list[dict[str, Any]]] = {
    "agent-reader": [
        _rule(GROUP, ["devices"], ["get", "list", "watch", "read", "listen"]),
        _rule(GROUP, ["intents"], ["get", "list", "watch"]),
        # The rules that may deny them: agents see them (iot.query lists them per device), never change them.
        _rule(GROUP, ["interlocks"], ["get", "list", "watch"]),
        # The kill switch: agents (and the gateway, as them) see that they are paused and why.
        _rule(GROUP, ["agentpauses"], ["get", "list", "watch"]),
        # What acts on the devices without an agent: agents see the Rules, their state and last firing.
        _rule(GROUP, ["rules"], ["get", "list", "watch"]),
        # Samples through the API server (APIService readings.corral.dev): the API server wants `get` on the
        # aggregated resource before it passes a request on; the controller then asks for `listen`.
        _rule(READINGS_GROUP, ["devices"], ["get"]),
    ],
    "agent-operator": [
        # annotate: the overlay (alias, note, location), set by Intents; it gives no control over spec.target
        _rule(GROUP, ["devices"], ["get", "list", "watch", "read", "listen", "write", "annotate"]),
        # watch: the gateway follows an Intent to its outcome instead of polling it. patch: the requester
        # withdraws its own waiting Intent (annotation corral.dev/cancel; an admission policy allows nobody else,
        # and the spec is immutable).
        _rule(GROUP, ["intents"], ["get", "list", "watch", "create", "patch"]),
        _rule(GROUP, ["interlocks"], ["get", "list", "watch"]),
        _rule(GROUP, ["agentpauses"], ["get", "list", "watch"]),
        _rule(GROUP, ["rules"], ["get", "list", "watch"]),
        _rule(READINGS_GROUP, ["devices"], ["get"]),
    ],
    # Writes Rules (iot.rules.put/restore), bound beside agent-operator. No delete: an agent changes a Rule in
    # revisions a person can see, accept and restore, never makes one disappear. It is not enough alone: the
    # admission policy also wants `write` on every Device the Rule sets and `use` on its ServiceAccount.
    "agent-rule-writer": [
        _rule(GROUP, ["rules"], ["get", "list", "watch", "create", "update", "patch"]),
    ],
    "approver": [
        _rule(GROUP, ["devices"], ["get", "list", "read", "approve"]),
        # create: a person breaks a lease (corral lease break) with an Intent, as every lease action is made, so it
        # is decided, audited and told like any other. It gives no control: each Intent is decided against the
        # requester's verbs on the Device, and this role has neither write nor annotate (a set_state: DENY_SCOPE).
        _rule(GROUP, ["intents"], ["get", "list", "watch", "create"]),
        _rule(GROUP, ["approvals"], ["get", "list", "create"]),
        # Standing approvals, in bounds; revoking one is deleting it.
        _rule(GROUP, ["approvalgrants"], ["get", "list", "watch", "create", "delete"]),
        # People keep the safety rules: whoever may approve actions on devices may also forbid them.
        _rule(GROUP, ["interlocks"], ["get", "list", "watch", "create", "update", "patch", "delete"]),
        # The agents kill switch (corral agents pause/resume): people stop every agent at once.
        _rule(GROUP, ["agentpauses"], ["get", "list", "watch", "create", "update", "patch", "delete"]),
        # Rules: people write them, and accept an agent's revision (approve; the acceptance is an annotation, so
        # patch too). Their own switch is the AgentPause `rules` (corral rules pause/resume), covered above.
        _rule(GROUP, ["rules"], ["get", "list", "watch", "create", "update", "patch", "delete", "approve"]),
        # Bridged candidates: people see what the bridge found. Accepting one (corral devices accept-discovered)
        # makes a Device and grants broker topics, an enrollment: the enroller's rights, which no role here grants.
        _rule(GROUP, ["discovereddevices"], ["get", "list", "watch"]),
        _rule("events.k8s.io", ["events"], ["list"]),
    ],
    # Capabilities are device-type contracts (cluster-scoped, not secret); agents need them to see actions.
    "capability-reader": [_rule(GROUP, ["capabilities"], ["get", "list"])],
    # Reads the audit log from the controller's HTTPS server (cluster-wide; a Role in a namespace: its part).
    "audit-reader": [_rule(GROUP, ["devices"], ["audit"])],
}


def user_roles(prefix: str = "corral") -> list[dict[str, Any]]:
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": f"{prefix}-{name}"}, "rules": rules}
            for name, rules in USER_ROLE_RULES.items()]

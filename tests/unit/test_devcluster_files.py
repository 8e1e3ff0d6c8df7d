"""What `corral dev up` writes for people and scripts: kubeconfig, env file, token list, broker config."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from corral.devcluster import files
from corral.devcluster.plane import DevPlane

CHART_README = Path(__file__).resolve().parents[2] / "charts" / "corral" / "README.md"


def test_kubeconfig_has_an_admin_context_and_a_rightless_user_context() -> None:
    config = yaml.safe_load(files.kubeconfig("https://127.0.0.1:6443", b"CA PEM", "admin-tok", "user-tok"))
    assert config["current-context"] == files.ADMIN_CONTEXT
    users = {u["name"]: u["user"]["token"] for u in config["users"]}
    contexts = {c["name"]: c["context"]["user"] for c in config["contexts"]}
    assert contexts == {files.ADMIN_CONTEXT: files.ADMIN_USER, files.DEV_USER_CONTEXT: files.DEV_USER}
    assert users == {files.ADMIN_USER: "admin-tok", files.DEV_USER: "user-tok"}
    cluster = config["clusters"][0]["cluster"]
    assert cluster["server"] == "https://127.0.0.1:6443"
    assert "insecure-skip-tls-verify" not in cluster
    assert cluster["certificate-authority-data"] == "Q0EgUEVN"


def test_token_file_puts_only_the_admin_in_system_masters() -> None:
    rows = files.token_auth_csv("a", "u").splitlines()
    assert rows == [f'a,{files.ADMIN_USER},{files.ADMIN_USER},"system:masters"', f"u,{files.DEV_USER},{files.DEV_USER}"]


def test_env_file_can_be_sourced_even_with_spaces_in_paths(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "my dir" / "kubeconfig"
    env = tmp_path / "env"
    env.write_text(files.env_file(kubeconfig, "mqtt://corral-controller@127.0.0.1:1883", tmp_path / "pw dir" / "pw",
                                  tmp_path / "bin dir"))
    out = subprocess.run(
        ["bash", "-c", f'source "{env}" && printf "%s\\n%s\\n%s\\n%s" "$KUBECONFIG" "$CORRAL_MQTT_URL" '
                       f'"$CORRAL_MQTT_PASSWORD_FILE" "${{PATH%%:*}}"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == [str(kubeconfig), "mqtt://corral-controller@127.0.0.1:1883", str(tmp_path / "pw dir" / "pw"),
                   str(tmp_path / "bin dir")]


def test_env_file_exports_no_credential_only_where_the_password_file_is() -> None:
    text = files.env_file(Path("/k"), "mqtts://corral-controller@127.0.0.1:8883", Path("/s/controller.password"),
                          Path("/bin"), Path("/s/ca.crt"))
    exported = dict(line.removeprefix("export ").split("=", 1) for line in text.splitlines() if line.startswith("export"))
    assert exported["CORRAL_MQTT_URL"] == "mqtts://corral-controller@127.0.0.1:8883"  # the account, by name only
    assert exported["CORRAL_MQTT_PASSWORD_FILE"] == "/s/controller.password"
    assert not [name for name in exported if re.search("PASSWORD$|TOKEN|SECRET|KEY$", name)]
    with pytest.raises(ValueError, match="exports no password"):
        files.env_file(Path("/k"), "mqtt://corral-controller:s3cret@127.0.0.1:1883", Path("/pw"), Path("/bin"))


def test_broker_listens_on_loopback_only() -> None:
    conf = files.mosquitto_conf(18830).splitlines()
    assert "listener 18830 127.0.0.1" in conf
    assert not any(line.startswith("listener") and "127.0.0.1" not in line for line in conf)
    # Two retained messages per device arrive at once when the controller connects: none may be dropped.
    assert "max_queued_messages 100000" in conf


def _audit_level(policy: dict, group: str, resource: str, verb: str) -> str:
    """The level the first matching rule gives a request (how kube-apiserver reads a Policy)."""
    for rule in policy["rules"]:
        if rule.get("verbs") and verb not in rule["verbs"]:
            continue
        kinds = rule.get("resources")
        if kinds and not any(k["group"] == group and (not k.get("resources") or resource in k["resources"])
                             for k in kinds):
            continue
        return str(rule["level"])
    return "None"


def test_kube_audit_policy_records_corral_writes_with_bodies_and_nothing_else() -> None:
    policy = yaml.safe_load(files.kube_audit_policy())
    assert (policy["apiVersion"], policy["kind"]) == ("audit.k8s.io/v1", "Policy")
    assert policy["omitStages"] == ["RequestReceived"]
    for resource in ("intents", "approvals", "devices", "capabilities", "auditcheckpoints"):
        for verb in ("create", "update", "patch", "delete", "deletecollection"):
            assert _audit_level(policy, "corral.dev", resource, verb) == "RequestResponse", (resource, verb)
        for verb in ("get", "list", "watch"):
            assert _audit_level(policy, "corral.dev", resource, verb) == "None", (resource, verb)
    for resource in ("devices/status", "intents/status", "approvals/status"):
        assert _audit_level(policy, "corral.dev", resource, "patch") == "Metadata", resource  # the controller's
    for group, resource in (("", "configmaps"), ("", "secrets"), ("rbac.authorization.k8s.io", "rolebindings")):
        assert _audit_level(policy, group, resource, "create") == "None", resource
    assert policy["rules"][-1] == {"level": "None"}


def test_chart_readme_shows_the_same_audit_policy_as_the_local_plane_runs() -> None:
    readme = CHART_README.read_text()
    section = readme.split("## Kubernetes' own audit (k3s)", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert block is not None, "no yaml block under the audit heading of the chart README"
    assert yaml.safe_load(block[1]) == yaml.safe_load(files.kube_audit_policy())


def test_local_plane_runs_kube_apiserver_with_the_audit_policy(tmp_path: Path) -> None:
    plane = DevPlane(tmp_path)
    argv = plane._apiserver_argv(Path("/bin/corral-kube"), 6443, node_flags=[])  # a plane without a node
    flags = argv[argv.index("--") + 1:]
    assert f"--audit-policy-file={tmp_path / 'kube-audit-policy.yaml'}" in flags
    assert f"--audit-log-path={tmp_path / 'kube-audit.log'}" in flags
    assert {"--audit-log-maxsize=100", "--audit-log-maxbackup=3"} <= set(flags)


def test_broker_takes_packets_up_to_the_largest_contract_and_logs_refusals_to_a_file_line_by_line() -> None:
    conf = files.mosquitto_conf(18830, debug_log=Path("/state/broker/mosquitto-debug.log")).splitlines()
    assert f"max_packet_size {files.MAX_PACKET_SIZE}" in conf and files.MAX_PACKET_SIZE == 262144
    # Only the debug log names a refused PUBLISH; a file, which Mosquitto writes line by line (stdout: in blocks).
    assert "log_type debug" in conf and "log_dest file /state/broker/mosquitto-debug.log" in conf
    assert "log_dest stdout" not in conf
    assert "log_type debug" not in files.mosquitto_conf(18830).splitlines()


def test_the_env_file_names_the_brokers_debug_log_for_corral_run() -> None:
    text = files.env_file(Path("/k"), "mqtt://corral-controller@127.0.0.1:1883", Path("/s/pw"), Path("/bin"),
                          broker_log=Path("/s/broker/mosquitto-debug.log"))
    assert "export CORRAL_BROKER_LOG=/s/broker/mosquitto-debug.log" in text.splitlines()
    assert text.splitlines()[-1].startswith("export PATH=")

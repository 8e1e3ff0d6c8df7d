"""What `corral dev up` writes for people and scripts: kubeconfig, env file, token list, broker config."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from corral.devcluster import files


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
    env.write_text(files.env_file(kubeconfig, "mqtt://127.0.0.1:1883", tmp_path / "bin dir"))
    out = subprocess.run(
        ["bash", "-c", f'source "{env}" && printf "%s\\n%s\\n%s" "$KUBECONFIG" "$CORRAL_MQTT_URL" "${{PATH%%:*}}"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == [str(kubeconfig), "mqtt://127.0.0.1:1883", str(tmp_path / "bin dir")]


def test_broker_listens_on_loopback_only() -> None:
    conf = files.mosquitto_conf(18830).splitlines()
    assert "listener 18830 127.0.0.1" in conf
    assert not any(line.startswith("listener") and "127.0.0.1" not in line for line in conf)
    # Two retained messages per device arrive at once when the controller connects: none may be dropped.
    assert "max_queued_messages 100000" in conf

"""Secrets reach processes by file, never by argument or environment (finding 1): which files are believed,
and the commands that refuse a password in a broker URL, saying how to pass it instead."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from corral.cli.main import cli
from corral.devcluster.processes import child_environment
from corral.devices.link import BrokerAddress
from corral.privatefile import SecretFileError, read_secret, write_private

PASSWORD = "s3cr3t-Pa55word"


def _file(tmp_path: Path, mode: int, text: str = PASSWORD + "\n") -> Path:
    path = tmp_path / "controller.password"
    write_private(path, text)
    path.chmod(mode)
    return path


def test_a_private_file_gives_its_secret_without_the_newline(tmp_path: Path) -> None:
    assert read_secret(_file(tmp_path, 0o600)) == PASSWORD
    assert read_secret(_file(tmp_path, 0o400)) == PASSWORD


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o660, 0o606])
def test_a_file_others_could_read_or_write_is_refused_with_its_mode_and_the_fix(tmp_path: Path, mode: int) -> None:
    path = _file(tmp_path, mode)
    with pytest.raises(SecretFileError) as refused:
        read_secret(path, "MQTT password")
    message = str(refused.value)
    assert f"mode {mode:04o}" in message and f"chmod 600 {path}" in message and PASSWORD not in message


def test_root_may_share_a_secret_with_the_group_as_a_kubernetes_secret_volume_mounts_it(tmp_path: Path) -> None:
    """A Pod's fsGroup makes a Secret volume's files root:fsGroup 0440; PostgreSQL's rule for its key files."""
    if os.geteuid() != 0:
        pytest.skip("needs a file owned by root")
    assert read_secret(_file(tmp_path, 0o440)) == PASSWORD
    with pytest.raises(SecretFileError, match="mode 0644"):
        read_secret(_file(tmp_path, 0o644))


def test_a_missing_or_empty_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SecretFileError, match="does not exist"):
        read_secret(tmp_path / "nothing")
    with pytest.raises(SecretFileError, match="is empty"):
        read_secret(_file(tmp_path, 0o600, "\n"))


def test_a_broker_address_never_shows_its_password() -> None:
    address = BrokerAddress.parse(f"mqtt://u:{PASSWORD}@127.0.0.1:1883")
    assert address.password == PASSWORD and PASSWORD not in repr(address)
    with pytest.raises(ValueError) as refused:
        BrokerAddress.parse(f"http://u:{PASSWORD}@127.0.0.1:1883")
    assert PASSWORD not in str(refused.value)


@pytest.mark.parametrize("command", [
    ["run", "--mqtt", f"mqtt://corral-controller:{PASSWORD}@127.0.0.1:1883"],
    ["sim", "--device", "relay", "--mqtt", f"mqtt://corral-controller:{PASSWORD}@127.0.0.1:1883"],
    ["demo", "--mqtt", f"mqtts://corral-controller:{PASSWORD}@broker:8883", "--state-dir", "/nonexistent/corral"],
])
def test_a_password_in_the_broker_url_is_refused_saying_how_to_pass_it(command: list[str]) -> None:
    result = CliRunner().invoke(cli, command, env={"CORRAL_MQTT_URL": None, "CORRAL_MQTT_PASSWORD_FILE": None})
    assert result.exit_code == 2, result.output
    assert "--mqtt-password-file FILE" in result.stderr and "chmod 600" in result.stderr
    assert "corral-controller@" in result.stderr  # the URL to use instead: the username only
    assert PASSWORD not in result.output


def test_the_same_password_in_the_environment_is_refused_too() -> None:
    result = CliRunner().invoke(cli, ["run"], env={"CORRAL_MQTT_URL": f"mqtt://c:{PASSWORD}@127.0.0.1:1883"})
    assert result.exit_code == 2 and "the URL carries a password" in result.stderr and PASSWORD not in result.output


def test_run_refuses_a_password_file_others_can_read(tmp_path: Path) -> None:
    path = _file(tmp_path, 0o644)
    result = CliRunner().invoke(cli, ["run", "--mqtt", "mqtt://corral-controller@127.0.0.1:1883",
                                      "--mqtt-password-file", str(path)], env={"CORRAL_MQTT_URL": None})
    assert result.exit_code == 2 and "others could read it" in result.stderr and PASSWORD not in result.output


def test_run_help_documents_the_password_file() -> None:
    result = CliRunner().invoke(cli, ["run", "--help"])
    assert "--mqtt-password-file FILE" in result.output and "CORRAL_MQTT_PASSWORD_FILE" in result.output
    assert "--listen-host" in result.output


def test_a_child_of_the_plane_or_the_demo_inherits_only_paths_and_the_locale() -> None:
    parent = {"PATH": "/usr/bin", "HOME": "/root", "LC_ALL": "C.UTF-8", "PYTHONPATH": "/src", "GITHUB_TOKEN": "t0k3n",
              "CORRAL_MQTT_URL": f"mqtt://c:{PASSWORD}@h:1883", "AWS_SECRET_ACCESS_KEY": "k3y",
              "HTTPS_PROXY": "http://user:pw@proxy:3128"}
    child = child_environment(parent, KUBECONFIG="/state/kubeconfig")
    assert child == {"PATH": "/usr/bin", "HOME": "/root", "LC_ALL": "C.UTF-8", "PYTHONPATH": "/src",
                     "KUBECONFIG": "/state/kubeconfig"}


def test_a_token_file_others_can_read_or_a_token_given_twice_is_refused(tmp_path: Path) -> None:
    token = _file(tmp_path, 0o644)
    shown = CliRunner().invoke(cli, ["audit", "show", "--server", "https://127.0.0.1:1", "--token-file", str(token)])
    assert shown.exit_code == 2 and "others could read it" in shown.stderr and PASSWORD not in shown.output
    token.chmod(0o600)
    for first, second in ((["--token", "x"], ["--token-file", str(token)]), (["--token-file", str(token)], ["--token", "x"])):
        both = CliRunner().invoke(cli, ["readings", "lamp", "--server", "https://127.0.0.1:1", *first, *second])
        assert both.exit_code == 2 and "give --token or --token-file, not both" in both.stderr
    read = CliRunner().invoke(cli, ["audit", "show", "--server", "https://127.0.0.1:1", "--token-file", str(token)])
    assert read.exit_code == 1 and "cannot reach https://127.0.0.1:1" in read.stderr  # the file was taken

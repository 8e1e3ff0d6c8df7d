"""The controller's broker accounts, one per replica: the plugin's starting state, `corral broker init-dynsec
--controller-username` and `acl-file --controller-user`, and the local plane's four accounts (issue 31)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from corral.cli.broker import PASSWORD_ENV, broker
from corral.devcluster import files

SALTS = tuple(bytes([n]) * 12 for n in range(1, 7))


def _verifies(client: dict, password: str) -> bool:
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), base64.b64decode(client["salt"]), client["iterations"])
    return base64.b64encode(digest).decode() == client["password"]


def test_every_controller_account_has_the_controller_password_and_role_and_a_salt_of_its_own() -> None:
    state = files.dynsec_config("pw", "admin-pw", SALTS[:5], files.LOCAL_CONTROLLER_ACCOUNTS)
    clients = {c["username"]: c for c in state["clients"]}
    assert list(clients) == ["corral-controller", "corral-controller-1", "corral-controller-2", "corral-controller-3",
                             "corral-admin"]
    for name in files.LOCAL_CONTROLLER_ACCOUNTS:
        assert clients[name]["roles"] == [{"rolename": files.BROKER_CONTROLLER}]
        assert _verifies(clients[name], "pw") and not _verifies(clients[name], "admin-pw")
        assert "textdescription" not in clients[name], "the device-account sync deletes only what it marked"
    assert _verifies(clients["corral-admin"], "admin-pw")
    assert len({c["salt"] for c in clients.values()}) == 5
    assert [r["rolename"] for r in state["roles"]] == [files.BROKER_CONTROLLER, files.BROKER_ADMIN]


def test_the_default_is_the_one_controller_account_of_before() -> None:
    state = files.dynsec_config("pw", None, SALTS[:1])
    assert [c["username"] for c in state["clients"]] == [files.BROKER_CONTROLLER]


def test_too_few_salts_or_bad_names_are_refused_saying_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="one salt per account: 5 accounts, 2 salts"):
        files.dynsec_config("pw", "admin-pw", SALTS[:2], files.LOCAL_CONTROLLER_ACCOUNTS)
    for bad, said in (("iot/x", "bad controller username"), ("a+", "bad controller username"),
                      ("-lead", "bad controller username"), ("", "bad controller username"),
                      (files.BROKER_ADMIN, "admin account")):
        with pytest.raises(ValueError, match=said):
            files.check_controller_usernames([bad])
    with pytest.raises(ValueError, match="given twice: c-0"):
        files.check_controller_usernames(["c-0", "c-1", "c-0"])
    with pytest.raises(ValueError, match="at least one"):
        files.check_controller_usernames([])


def test_init_dynsec_writes_one_account_per_controller_username(tmp_path: Path) -> None:
    out = tmp_path / "dynsec.json"
    names = ["corral-controller-0", "corral-controller-1", "corral-controller-2"]
    args = ["init-dynsec", "--file", str(out)]
    for name in names:
        args += ["--controller-username", name]
    result = CliRunner().invoke(broker, args, env={PASSWORD_ENV: "s3cret"})
    assert result.exit_code == 0, result.output
    assert "accounts corral-controller-0, corral-controller-1, corral-controller-2" in result.output
    state = json.loads(out.read_text())
    assert [c["username"] for c in state["clients"]] == names
    assert all(_verifies(c, "s3cret") for c in state["clients"])
    assert out.stat().st_mode & 0o777 == 0o600


def test_init_dynsec_without_a_username_makes_the_account_of_before(tmp_path: Path) -> None:
    out = tmp_path / "dynsec.json"
    result = CliRunner().invoke(broker, ["init-dynsec", "--file", str(out)], env={PASSWORD_ENV: "s3cret"})
    assert result.exit_code == 0, result.output
    assert [c["username"] for c in json.loads(out.read_text())["clients"]] == [files.BROKER_CONTROLLER]


def test_init_dynsec_refuses_a_repeated_or_bad_username_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "dynsec.json"
    for names in (["r-0", "r-0"], ["r/0"]):
        args = ["init-dynsec", "--file", str(out)] + [a for n in names for a in ("--controller-username", n)]
        result = CliRunner().invoke(broker, args, env={PASSWORD_ENV: "s3cret"})
        assert result.exit_code == 2 and "--controller-username" in result.output, result.output
    assert not out.exists()


def test_acl_file_gives_every_controller_user_the_prefix() -> None:
    result = CliRunner().invoke(broker, ["acl-file", "--topic-prefix", "ext", "--controller-user", "c-0",
                                         "--controller-user", "c-1"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for user in ("c-0", "c-1"):
        at = lines.index(f"user {user}")
        assert lines[at + 1] == "topic readwrite ext/#"
    default = CliRunner().invoke(broker, ["acl-file"]).output.splitlines()
    assert f"user {files.BROKER_CONTROLLER}" in default and sum(line.startswith("user ") for line in default) == 1

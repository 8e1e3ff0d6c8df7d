"""The `corral` command: help everywhere, errors a person can act on."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from corral.cli.main import cli
from corral.client.intents import outcome_code


@pytest.mark.parametrize("args", [[], ["dev"], ["dev", "up"], ["dev", "down"], ["dev", "status"], ["dev", "build"]])
def test_every_command_has_help(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, "--help"])
    assert result.exit_code == 0
    assert "Usage: " in result.output


def test_missing_kube_sources_are_reported_on_stderr_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_KUBE_SOURCE", "/nonexistent/tools/kube")
    monkeypatch.delenv("CORRAL_KUBE_BINARY", raising=False)
    result = CliRunner().invoke(cli, ["dev", "build"])
    assert result.exit_code == 1
    assert "cannot find /nonexistent/tools/kube/go.mod" in result.stderr
    assert "CORRAL_KUBE_BINARY" in result.stderr
    assert result.stdout == ""


def test_what_a_caller_is_told_an_intent_status_means_including_a_dry_run() -> None:
    assert outcome_code({"phase": "Succeeded", "code": "EXECUTED"}) == "EXECUTED"
    assert outcome_code({"phase": "AwaitingApproval"}) == "AWAITING_APPROVAL"
    assert outcome_code({}) == outcome_code({"phase": "Executing"}) == "PENDING"
    assert outcome_code({"phase": "DryRun", "would": "await_approval"}) == "AWAITING_APPROVAL"
    assert outcome_code({"phase": "DryRun", "would": "await_hold"}) == "PENDING"
    assert outcome_code({"phase": "DryRun", "would": "final", "code": "DENY_SENSOR"}) == "DENY_SENSOR"

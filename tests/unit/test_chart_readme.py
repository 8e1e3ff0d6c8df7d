"""The chart README: its table of people's and agents' roles says what the roles grant; its k3s install runs."""

from __future__ import annotations

import shlex

import click

from corral.api.roles import USER_ROLE_RULES
from corral.cli.main import cli
from tests.chart_readme import k3s_install_commands, user_role_rights


def test_the_chart_readme_lists_every_right_of_every_user_role() -> None:
    granted = {role: {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
                      for resource in rule["resources"] for verb in rule["verbs"]}
               for role, rules in USER_ROLE_RULES.items()}
    assert user_role_rights() == granted


def test_the_k3s_install_block_runs_corral_commands_that_exist_with_options_they_have() -> None:
    """A test on a real node runs the block as it stands: every `corral` line names a command and options it has."""
    commands = k3s_install_commands("10.1.2.3", ["image.pullPolicy=Never"])
    corral = [shlex.split(c.rstrip("&")) for c in commands if c.startswith("corral ")]
    assert len(corral) >= 4
    for words in corral:
        command: click.Command = cli
        words = words[1:]
        while isinstance(command, click.Group):
            command, words = command.commands[words[0]], words[1:]
        known = {opt for param in command.params for opt in [*param.opts, *param.secondary_opts]}
        given = {word.split("=", 1)[0] for word in words if word.startswith("-")}
        assert given <= known, (words, given - known)

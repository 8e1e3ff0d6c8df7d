"""The chart README's table of people's and agents' roles says what the roles grant."""

from __future__ import annotations

from corral.api.roles import USER_ROLE_RULES
from tests.chart_readme import user_role_rights


def test_the_chart_readme_lists_every_right_of_every_user_role() -> None:
    granted = {role: {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
                      for resource in rule["resources"] for verb in rule["verbs"]}
               for role, rules in USER_ROLE_RULES.items()}
    assert user_role_rights() == granted

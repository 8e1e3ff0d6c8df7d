"""What `corral people add` tells the person who ran it: what the new person can do now, or how to let them."""

from __future__ import annotations

from corral.cli.people import can_now


def test_a_person_with_the_approver_role_is_told_where_they_may_approve() -> None:
    said = "\n".join(can_now("alice", "system:serviceaccount:corral-people:alice", "home", "corral-approver",
                             "ClusterRole"))
    assert "sign in to the approval page (corral console)" in said
    assert "see the Intents waiting in namespace home and approve or deny them" in said
    assert "ClusterRole corral-approver, RoleBinding corral-approver-alice in home" in said
    assert "corral people add alice -n OTHER" in said


def test_a_person_without_a_role_is_told_the_page_shows_nothing_and_the_command_that_fixes_it() -> None:
    said = "\n".join(can_now("bob", "system:serviceaccount:corral-people:bob", "home", None, None))
    assert "will show them no Intents" in said and "corral people add bob -n home (binds corral-approver)" in said
    assert "approve or deny them" not in said

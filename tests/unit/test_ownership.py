"""Who a Secret made by `corral secrets ensure` belongs to when it is found again: the reference to a previous
ServiceAccount of the same name (a release uninstalled and installed again) becomes one to the live one, a kept
Secret loses it, and nothing else is touched. No cluster here: the same on the API server, and against its
garbage collector, is in tests/integration/test_secrets_ownership.py."""

from __future__ import annotations

from corral.client.ownership import Owner, settled_references

LIVE = Owner("corral-controller", "uid-new")
OLD = {"apiVersion": "v1", "kind": "ServiceAccount", "name": "corral-controller", "uid": "uid-old"}
SOMEONE = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "someone", "uid": "uid-d", "controller": True}


def test_a_reference_to_the_previous_service_account_is_given_to_the_live_one() -> None:
    assert settled_references([OLD], LIVE, keep=False) == [LIVE.reference()]
    # Two stale ones (two quick reinstalls) become the one live reference; another owner stays, first.
    assert settled_references([OLD, SOMEONE, {**OLD, "uid": "uid-older"}], LIVE, keep=False) == [
        SOMEONE, LIVE.reference()]
    # Live and stale side by side: the stale one goes, or the Secret's owners would not be what ensure says.
    assert settled_references([LIVE.reference(), OLD], LIVE, keep=False) == [LIVE.reference()]


def test_a_secret_owned_by_the_live_service_account_is_left_as_it_is() -> None:
    assert settled_references([LIVE.reference()], LIVE, keep=False) is None
    assert settled_references([SOMEONE, LIVE.reference()], LIVE, keep=False) is None


def test_a_kept_secret_loses_its_references_to_the_service_account_old_or_live() -> None:
    """audit.keepOnUninstall turned on after an install that owned the keys, or an install right after one that
    did not keep them: either way the keys must outlive the release, so no ServiceAccount of this name owns
    them."""
    assert settled_references([OLD], LIVE, keep=True) == []
    assert settled_references([LIVE.reference(), SOMEONE], LIVE, keep=True) == [SOMEONE]
    assert settled_references([], LIVE, keep=True) is None
    assert settled_references([SOMEONE], LIVE, keep=True) is None


def test_nothing_is_adopted_and_nothing_changes_without_a_known_owner() -> None:
    # Made without a reference to this ServiceAccount (by a person, or another tool): it stays theirs.
    assert settled_references([], LIVE, keep=False) is None
    assert settled_references([SOMEONE], LIVE, keep=False) is None
    # A ServiceAccount of another name, or in another API group's kind, is not ours.
    other = {**OLD, "name": "corral-gateway"}
    assert settled_references([other], LIVE, keep=False) is None
    assert settled_references([{**OLD, "apiVersion": "example.dev/v1"}], LIVE, keep=False) is None
    # Run by a person (not as a ServiceAccount of the namespace): it cannot know which is the live owner.
    assert settled_references([OLD], None, keep=False) is None
    assert settled_references([OLD], None, keep=True) is None

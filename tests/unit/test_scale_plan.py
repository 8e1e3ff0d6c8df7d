"""The fair-share plan (scale/plan.py), alone and in a simulated fleet whose Lease store takes one holder per shard."""

from __future__ import annotations

import pytest

from corral.scale.plan import LeaseView, Plan, plan, target


def test_the_target_is_the_ceiling_of_shards_over_live_members() -> None:
    assert target(8, 3) == 3
    assert target(6, 3) == 2
    assert target(1, 2) == 1
    assert target(8, 0) == 8  # nobody counted (not even oneself yet): hold everything rather than nothing


def test_a_replica_alone_takes_every_free_shard_lowest_first() -> None:
    assert plan(4, "a", {}, 1, frozenset()) == Plan(acquire=(0, 1, 2, 3))


def test_below_its_share_it_takes_only_free_released_or_expired_shards() -> None:
    leases = {0: LeaseView("b"), 1: LeaseView(None), 2: LeaseView("c", expired=True), 3: LeaseView("b")}
    assert plan(4, "a", leases, 2, frozenset()) == Plan(acquire=(1, 2))


def test_it_takes_no_more_than_its_share() -> None:
    assert plan(8, "a", {}, 3, frozenset({5})) == Plan(acquire=(0, 1))


def test_a_lease_still_naming_this_process_but_not_held_is_taken_back() -> None:
    # Its renew deadline passed: it acts on nothing there, so it need not wait out its own lease duration.
    assert plan(2, "a", {0: LeaseView("a"), 1: LeaseView("b")}, 2, frozenset()) == Plan(acquire=(0,))


def test_above_its_share_it_gives_back_the_highest_numbered_first() -> None:
    assert plan(8, "a", {}, 3, frozenset({0, 1, 2, 6, 7})) == Plan(release=(7, 6))


def test_shard_zero_is_never_given_back_to_rebalance() -> None:
    assert plan(2, "a", {}, 2, frozenset({0, 1})) == Plan(release=(1,))
    assert 0 not in plan(4, "a", {}, 4, frozenset({0, 3})).release


def test_at_its_share_it_does_nothing() -> None:
    assert plan(6, "a", {0: LeaseView(None)}, 3, frozenset({4, 5})) == Plan()


def test_wrong_inputs_are_refused_saying_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="shards must be at least 1"):
        plan(0, "a", {}, 1, frozenset())
    with pytest.raises(ValueError, match=r"outside 0\.\.3"):
        plan(4, "a", {}, 1, frozenset({4}))


class Fleet:
    """Members running the plan against one Lease store: an acquisition wins only if the shard is free when it
    arrives (the resourceVersion precondition), a release frees it. Members see the store as it was at the
    start of the round, so they race as real replicas do."""

    def __init__(self, shards: int, members: list[str]) -> None:
        self.shards = shards
        self.members = list(members)
        self.holder: dict[int, str | None] = dict.fromkeys(range(shards))
        self.moves: list[tuple[int, str | None, str]] = []

    def held(self, member: str) -> frozenset[int]:
        return frozenset(k for k, h in self.holder.items() if h == member)

    def round(self) -> None:
        seen = {k: LeaseView(h) for k, h in self.holder.items()}
        steps = {m: plan(self.shards, m, seen, len(self.members), self.held(m)) for m in self.members}
        for member, step in steps.items():
            for k in step.release:
                assert self.holder[k] == member
                self.holder[k] = None
            for k in step.acquire:
                if self.holder[k] is None:  # else another won the race for it
                    self.moves.append((k, None, member))
                    self.holder[k] = member
        self.check()

    def check(self) -> None:
        for k in range(self.shards):
            holders = [m for m in self.members if k in self.held(m)]
            assert len(holders) <= 1, f"shard {k} held by {holders}"

    def leave(self, member: str) -> None:
        self.members.remove(member)
        for k, h in self.holder.items():
            if h == member:
                self.holder[k] = None  # released on stop, or expired: the same to the others

    def converge(self, rounds: int = 20) -> list[int]:
        for _ in range(rounds):
            self.round()
        return sorted((len(self.held(m)) for m in self.members), reverse=True)


def test_three_members_over_eight_shards_converge_to_three_three_two() -> None:
    fleet = Fleet(8, ["a", "b", "c"])
    assert fleet.converge() == [3, 3, 2]
    assert all(h is not None for h in fleet.holder.values())


def test_members_arriving_one_by_one_converge_and_every_shard_is_held() -> None:
    fleet = Fleet(8, ["a"])
    assert fleet.converge() == [8]
    fleet.members.append("b")
    assert fleet.converge() == [4, 4]
    fleet.members.append("c")
    assert fleet.converge() == [3, 3, 2]
    assert all(h is not None for h in fleet.holder.values())
    assert fleet.holder[0] == "a"  # the leader's shard never moved to rebalance


def test_a_member_leaving_moves_only_its_shards() -> None:
    fleet = Fleet(8, ["a", "b", "c"])
    fleet.converge()
    before = {m: fleet.held(m) for m in fleet.members}
    fleet.leave("c")
    assert fleet.converge() == [4, 4]
    for member in ("a", "b"):
        assert before[member] <= fleet.held(member), f"{member} lost a shard it held when c left"
    moved = fleet.held("a") - before["a"] | fleet.held("b") - before["b"]
    assert moved == before["c"]


@pytest.mark.parametrize("shards,members", [(1, 2), (2, 3), (6, 3), (16, 5), (3, 7)])
def test_every_shard_is_held_once_whatever_the_counts(shards: int, members: int) -> None:
    fleet = Fleet(shards, [f"m{n}" for n in range(members)])
    counts = fleet.converge()
    assert sum(counts) == shards
    assert max(counts) - min(counts) <= target(shards, members)
    assert max(counts) <= target(shards, members)

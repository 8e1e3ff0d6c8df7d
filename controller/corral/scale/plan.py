"""Which shards a replica should try to take and which it should give back this round. Pure: no I/O, no clock.

The plan is a fair share, not an assignment: a replica aims to hold `ceil(shards / live members)`, takes only
shards nobody holds (free, released, or expired on its own clock), and gives back its surplus. Nothing here
decides who holds a shard; the Lease does (`election`), so two replicas that disagree about the member count
can both want a shard but only one wins its Lease. Because a replica never takes a shard that is validly held by
another, a member leaving moves only that member's shards, and a member joining only takes what others give up.

Decisions the issue left open:
- Shards are taken lowest-numbered first, so shard 0 (the leader's) is the first a starting or surviving replica
  picks up: a fleet is never leaderless for longer than it must be.
- Surplus is given back highest-numbered first, and shard 0 is never given back to rebalance: it moves only when
  its holder stops or loses it. Leadership (the broker's accounts, deleting unused Capabilities) is the costliest
  thing to move, and since the target is never below 1, the holder of shard 0 can always give another shard back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

LEADER_SHARD = 0


@dataclass(frozen=True)
class LeaseView:
    """A shard's Lease as this replica last saw it. `holder` None: nobody (never created, or released);
    `expired`: its record has not changed for its lease duration on this replica's clock, so it may be taken."""

    holder: str | None
    expired: bool = False


@dataclass(frozen=True)
class Plan:
    acquire: tuple[int, ...] = ()
    release: tuple[int, ...] = ()


def target(shards: int, live_members: int) -> int:
    """The fair share: every shard has a home when every member holds this many, and none holds two more."""
    return math.ceil(shards / max(1, live_members))


def plan(shards: int, identity: str, leases: Mapping[int, LeaseView], live_members: int,
         held: frozenset[int]) -> Plan:
    """`held`: the shards this replica holds and is within its renew deadline for (renewals are not planned:
    a held shard is always renewed). `live_members` counts this replica too; a shard missing from `leases`
    has no Lease yet."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards}")
    outside = sorted(k for k in held if not 0 <= k < shards)
    if outside:
        raise ValueError(f"held shards {outside} are outside 0..{shards - 1}")
    share = target(shards, live_members)
    if len(held) < share:
        takeable = [k for k in range(shards) if k not in held and _takeable(leases.get(k), identity)]
        return Plan(acquire=tuple(takeable[:share - len(held)]))
    if len(held) > share:
        surplus = sorted((k for k in held if k != LEADER_SHARD), reverse=True)
        return Plan(release=tuple(surplus[:len(held) - share]))
    return Plan()


def _takeable(lease: LeaseView | None, identity: str) -> bool:
    # A Lease naming this very process (identity carries a per-process id) that it does not count as held was
    # lost past its renew deadline: this process knows it acts on nothing there, so it may take it back at once.
    return lease is None or lease.holder is None or lease.expired or lease.holder == identity

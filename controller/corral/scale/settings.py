"""The settings of leader election and sharding (`corral run --leader-elect ...`), with client-go's defaults."""

from __future__ import annotations

from dataclasses import dataclass

# client-go's leaderelection defaults (and controller-runtime's): a Lease is another's for 15 s after its last
# renewal; its holder gives up acting 10 s after its last successful renewal; attempts every 2 s.
LEASE_DURATION_S = 15.0
RENEW_DEADLINE_S = 10.0
RETRY_PERIOD_S = 2.0


@dataclass(frozen=True)
class ScaleSettings:
    """`enabled` False is a controller alone (the local plane, the tests): it holds every shard, writes no Lease
    and puts no epoch in its commands."""

    identity: str  # "<pod name>_<8 hex digits>": the Pod, and which process in it (a restarted container is another)
    namespace: str = "default"  # where the Leases live (the release's namespace in the chart)
    lease_prefix: str = "corral-controller"  # Leases "<prefix>-shard-<k>" and "<prefix>-member-<pod name>"
    shards: int = 1
    lease_duration_s: float = LEASE_DURATION_S
    renew_deadline_s: float = RENEW_DEADLINE_S
    retry_period_s: float = RETRY_PERIOD_S
    enabled: bool = False

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError(f"shards must be at least 1, got {self.shards}")
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_period_s:g} s, {self.renew_deadline_s:g} s and {self.lease_duration_s:g} s")

    @property
    def pod_name(self) -> str:
        return self.identity.rpartition("_")[0] or self.identity

    def shard_lease(self, shard: int) -> str:
        return f"{self.lease_prefix}-shard-{shard}"

    def member_lease(self) -> str:
        return f"{self.lease_prefix}-member-{self.pod_name}"

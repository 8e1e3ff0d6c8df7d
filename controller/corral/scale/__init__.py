"""Running more than one controller: which replica acts for which device (docs/scale.md).

Devices fall into a fixed number of virtual shards by a stable hash of their device id (`hashing`); each shard is
held through a `coordination.k8s.io/v1` Lease of its own (`election`, client-go's algorithm); a replica holds its
fair share of them (`plan`, pure) and acts only for the devices of the shards it holds, and only until its renew
deadline (`ownership`). One shard is the active/standby case; the holder of shard 0 is the leader, which alone
does what only one replica may (the broker's accounts, deleting unused Capabilities).
"""

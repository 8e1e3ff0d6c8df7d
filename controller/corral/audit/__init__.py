"""Audit: Kubernetes Events a person can read (events), and the durable record being built for issue 16:
signed, hash-chained records (chain) and the checkpoints that show how far the log had reached
(checkpoint). The record is not written by the controller yet."""

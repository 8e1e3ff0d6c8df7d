"""Audit: Kubernetes Events a person can read (events), and the durable record being built for issue 16:
signed, hash-chained records (chain), the files they are fsynced into with group commit (log), and the
checkpoints that show how far the log had reached (checkpoint). The controller does not write it yet."""

"""The fleet: every node of nodes.toml at once (status, running stages, plan progress, disks,
alerts, cost). `NodeWatch` polls one node; `Fleet` polls them all in parallel with backoff."""

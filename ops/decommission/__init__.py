"""Preserving a node before it is shut down.

Entry points (`for_node`): `open_decommission(node, Options(...))` (a configured node, as the CLI
uses it), `decommission_for(NodeHandle, Options(...))` / `decommission_on(Host, NodeConfig, Options(...))`,
each giving a `wizard.Decommission` whose `run()` does every step and returns the SafetyVerdict.

Layout: `wizard` holds a run's state and its step sequence, given `inputs` (Options, the plan's stage
states); `own_env` is what `nodedeck node setup` made on the node (which setup makes again).
Listing: `inventory` (one remote `find`), `links` (where symlinks lead), `classify` (what kind each
file is), `sysinfo` (what the node was). Choosing: `policy` (Policy per class, Action per file), `s3`
(files already in S3), `selection` (each file's Action). Copying: `transfer` (resumed, parallel,
hashed in the same pass), `download` (the step), `localtree` (the destination, through directory
fds), `direct` and `durable` (O_DIRECT writes, an fsync per file), `live` (files that change while
copied), `ledger` (what earlier runs verified). Proving: `checksums` (hashes on the node), `verify`
(the copy against the node), `verification` (how a file was proven), `verdict` (SAFE TO SHUT DOWN or
not). Records and output: `filestate` (one file's live record), `events` (what the wizard reports),
`results` (the frozen records it yields), `report` and `manifest` (PROGRESS.md and manifest.json).
"""

"""Per-node state kept on this machine: runs, events, audit log, stage states.

One SQLite file per node (`state_dir()/nodes/<node>.sqlite`) in WAL mode, so the TUI and a CLI command can
use it at the same time; one connection per store object, shared by its threads under a lock. The schema
carries a version and grows only through the MIGRATIONS list (SQL scripts, and functions that move data
written by an older nodedeck into its new place).

Faults are one line naming the file, never a traceback or silent loss: a new file is created whole (built
beside it, then linked in), so an empty (0-byte) or damaged file is refused with the command that restores
the rolling backup (`nodedeck state restore`); a write that fails (disk full, read-only or immutable file)
raises StateWriteError and changes nothing, so the caller can retry it. The backup is taken with SQLite's
online backup API on open and then every BACKUP_EVERY seconds of writing, checked before it replaces the
last one.

Layout: `file` opens the file (StateFile: connection, transactions, faults as errors, rolling backups),
`schema` its tables and MIGRATIONS, `faults` the one-line errors, `backup` the backups and `restore`; one
module per table, each a StateFile subclass: `runs` (RunRecord), `stages` (StageStateRow, launch leases),
`events` (StoredEvent), `audit` (AuditEntry), `kv`; `store` joins them into StateStore. The package gives
the store, the records it returns and the errors it raises.
"""

from ops.state.audit import AuditEntry
from ops.state.events import StoredEvent
from ops.state.faults import StateFileError, StateWriteError
from ops.state.runs import RunRecord
from ops.state.stages import StageStateRow
from ops.state.store import StateStore

__all__ = ["AuditEntry", "RunRecord", "StageStateRow", "StateFileError", "StateStore", "StateWriteError",
           "StoredEvent"]

"""nodedeck's own live files in the node root: a SQLite state in WAL mode written during the copy,
and stage logs that grow. SAFE is reachable, the copies are consistent, and what blocks is named."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

from ops.decommission.inputs import Options
from ops.decommission.wizard import Decommission
from tests.support.decommission_tree import run_wizard

DB = "state/nodedeck/nodes/gpu1.sqlite"
LOG = ".nodedeck/runs/nd-train.log"


class Busy:
    """Writes to the database and appends to the log until stopped (and at least a few times)."""

    def __init__(self, root: Path):
        self.root = root
        (root / DB).parent.mkdir(parents=True)
        (root / LOG).parent.mkdir(parents=True)
        self.db = sqlite3.connect(root / DB, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE events (n INTEGER, text TEXT)")
        self.n = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        (root / LOG).write_bytes(b"step 0\n" * 100)
        self.step()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def step(self) -> None:
        with self.lock:
            self.n += 1
            self.db.execute("INSERT INTO events VALUES (?, ?)", (self.n, "x" * 500))
            with open(self.root / LOG, "ab") as f:
                f.write(b"step %d\n" % self.n)

    def _run(self) -> None:
        while not self.stop.wait(0.01):
            self.step()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.db.close()


def _run(root: Path, dest: Path, busy: Busy, **opts) -> Decommission:
    def during(ev):  # certainly written while the download runs
        if ev.step == "download":
            busy.step()

    return run_wizard(root, dest, on_event=during, **opts)


def test_live_sqlite_state_and_growing_stage_logs_reach_safe(tmp_path):
    root = tmp_path / "node"
    root.mkdir()
    (root / "notes.md").write_text("hello\n")
    dest = tmp_path / "dest"
    with Busy(root) as busy:
        listed_log = None
        d = _run(root, dest, busy)
        listed_log = d.files[LOG].entry.size
    assert d.verdict.safe, d.verdict.missing
    copy = sqlite3.connect(dest / "files" / DB)
    assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    rows = copy.execute("SELECT n FROM events ORDER BY n").fetchall()
    copy.close()
    assert rows and [r[0] for r in rows] == list(range(1, len(rows) + 1))  # a consistent prefix of the writes
    assert not (dest / "files" / (DB + "-wal")).exists()  # folded into the snapshot
    assert (dest / "files" / LOG).read_bytes() == (root / LOG).read_bytes()[:listed_log]
    said = " ".join(d.verdict.warnings)
    assert f"{LOG}: grew during the copy; preserved up to the {listed_log} bytes listed" in said
    c = d.verdict.counts
    assert c.sqlite_snapshots == 1 and c.in_sqlite_snapshot == 2  # -wal and -shm
    recs = {r["path"]: r for r in json.loads((dest / "manifest.json").read_text())["files"]}
    assert recs[DB]["sqlite_snapshot"] and recs[DB]["verified_by"] == "sqlite-snapshot"
    assert recs[DB + "-wal"]["source"] == f"files/{DB}" and recs[DB + "-wal"]["verified"]
    assert recs[LOG]["preserved_bytes"] == listed_log
    assert c.files == c.verified == len(d.files)


def test_nodedeck_files_that_block_the_verdict_are_named_as_its_own(tmp_path):
    root = tmp_path / "node"
    root.mkdir()
    dest = tmp_path / "dest"
    with Busy(root) as busy:
        d = _run(root, dest, busy, python=str(tmp_path / "no-python"))  # no snapshot possible
    assert not d.verdict.safe
    said = " ".join(d.verdict.warnings)
    assert f"{DB}: no snapshot of this SQLite database" in said
    blocking = [m for m in d.verdict.missing if m.path.startswith(DB)]
    assert blocking and all("nodedeck's own state database" in m.reason for m in blocking)
    c = d.verdict.counts
    assert d.verdict.headline.startswith(f"NOT SAFE TO SHUT DOWN: {c.verified} of {c.files} files verified; "
                                         f"not preserved: {c.files - c.verified} file(s)")


def test_live_state_over_ssh_reaches_safe(sshd, tmp_path):
    from ops.decommission.for_node import decommission_on
    from ops.nodes import get_node, load_nodes, open_host

    root = tmp_path / "node"
    root.mkdir()
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.tn]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\nroot = "{root}"\n')
    node = get_node(load_nodes(cfg), "tn")
    dest = tmp_path / "dest"
    with Busy(root) as busy:
        host = open_host(node)
        d = decommission_on(host, node, Options(dest), on_event=lambda ev: ev.step == "download" and busy.step())
        d.run()
        host.close()
    assert d.transfer_note.startswith("OpenSSH ssh")
    assert d.verdict.safe, d.verdict.missing
    assert d.verdict.counts.sqlite_snapshots == 1
    copy = sqlite3.connect(dest / "files" / DB)
    assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    copy.close()

"""nodedeck reading opencode's database never makes opencode fail to start (issue 40's real-client tier caught it).

opencode 1.18 opens its database and runs `PRAGMA journal_mode = WAL` before it sets `busy_timeout`: a lock held at
that moment ends it with "database is locked". A reader that closed its connection at every poll (the last one
on a WAL database checkpoints on close, under an exclusive lock) failed 14 to 35 starts of 400; one kept open
still failed 1 start in about 1,300 when it was the first connection (WAL recovery takes exclusive locks). The
reader now takes no lock opencode could meet: `readonly_shm` beside a live opencode, `immutable` on a closed file.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import threading

from ops.agents import scan
from tests.support.agent_lists import write_opencode_db

STARTS = 300


def start_as_opencode(db: str) -> bool:
    """One opencode start: journal_mode with no busy timeout yet, then a todowrite. False: 'database is locked'."""
    con = sqlite3.connect(db, timeout=0)
    try:
        con.execute("PRAGMA journal_mode = WAL")
        con.execute("PRAGMA busy_timeout = 5000")
    except sqlite3.OperationalError:
        con.close()
        return False
    with con:
        con.execute("UPDATE todo SET time_updated = time_updated + 1")
    con.close()
    return True


def test_opencode_starts_while_the_panel_reads_its_database(tmp_path):
    db = str(write_opencode_db(tmp_path, "ses_1", [{"content": "train", "status": "pending"}]))
    done, reads, errors = threading.Event(), [], []

    def poll():
        while not done.is_set():
            lists = scan.read_opencode_db(db)
            (errors if any(x["error"] for x in lists) else reads).append(lists)

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        failed = sum(not start_as_opencode(db) for _ in range(STARTS))
    finally:
        done.set()
        reader.join()
    assert failed == 0, f"{failed} of {STARTS} opencode starts met 'database is locked'"
    assert reads and not errors
    assert [i["content"] for i in reads[-1][0]["items"]] == ["train"]


def test_the_node_scanner_exits_without_closing_the_database(tmp_path):
    """On a node the scanner is one python3 process per poll: it ends without SQLite's close (os._exit)."""
    home = tmp_path / "home"
    db = str(write_opencode_db(home, "ses_1", [{"content": "train", "status": "pending"}]))
    done, failed = threading.Event(), []

    def starts():
        while not done.is_set():
            failed.append(not start_as_opencode(db))

    writer = threading.Thread(target=starts)
    writer.start()
    try:
        argv = [sys.executable, "-c", open(scan.__file__).read(), str(home), "--agents", "opencode"]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        for _ in range(40):
            out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
            assert out.returncode == 0 and '"train"' in out.stdout, out.stderr[-500:]
    finally:
        done.set()
        writer.join()
    assert failed and not any(failed), f"{sum(failed)} of {len(failed)} opencode starts met 'database is locked'"


def live_opencode(home) -> tuple[str, sqlite3.Connection]:
    """An opencode database held open, with a todo marked completed still in its `-wal` (never checkpointed)."""
    db = str(write_opencode_db(home, "ses_1", [{"content": "train", "status": "pending"}]))
    live = sqlite3.connect(db)
    live.execute("PRAGMA wal_autocheckpoint = 0")
    with live:
        live.execute("UPDATE todo SET status = 'completed'")
    assert os.path.getsize(db + "-wal") > 0
    return db, live


def statuses(db: str) -> list[tuple[str, str]]:
    return [(i["content"], i["status"]) for i in scan.read_opencode_db(db)[0]["items"]]


def test_a_live_opencode_is_read_through_its_wal_without_a_lock(tmp_path):
    """opencode open: the rows still in `-wal` are read (readonly_shm), and the reader leaves no lock behind."""
    db, live = live_opencode(tmp_path / "a?b#c")
    assert statuses(db) == [("train", "completed")]
    assert start_as_opencode(db)
    live.close()


def test_a_wal_left_by_an_opencode_that_died_is_read(tmp_path):
    """A `-wal` with no `-shm` beside it: its rows count, and nothing opencode wrote is lost by the read."""
    db, live = live_opencode(tmp_path / "live")
    dead = tmp_path / "dead" / "opencode.db"
    dead.parent.mkdir()
    for suffix in ("", "-wal"):
        shutil.copyfile(db + suffix, str(dead) + suffix)
    live.close()
    assert statuses(str(dead)) == [("train", "completed")]


def test_a_closed_database_is_read_with_no_lock_at_all(tmp_path):
    """No opencode has it open: one immutable read, closed at once; a write after it is seen at the next read."""
    db = str(write_opencode_db(tmp_path, "ses_1", [{"content": "train", "status": "pending"}]))
    assert not os.path.exists(db + "-wal") and not os.path.exists(db + "-shm")
    assert scan.read_opencode_db(db)[0]["items"][0]["status"] == "pending"
    write_opencode_db(tmp_path, "ses_1", [{"content": "train", "status": "completed"}])
    assert scan.read_opencode_db(db)[0]["items"][0]["status"] == "completed"
    assert not os.path.exists(db + "-wal") and not os.path.exists(db + "-shm")

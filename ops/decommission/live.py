"""Files that change while they are copied, and how each is preserved consistently.

- SQLite databases (a `.sqlite`/`.sqlite3`/`.db` file, with its `-wal`, `-shm`,
  `-journal` beside it): copied as one snapshot taken on the node with SQLite's
  online backup API (the node's python), which folds the WAL in; the sidecars
  are covered by that snapshot. The snapshot counts only when the bytes that
  landed here are a database that opens and passes `PRAGMA integrity_check`
  here, its length is its page count times its page size, and it is not
  smaller than the file listed (`snapshot_fault`): the node's word (its
  sha256 of what it sent) proves nothing about what it sent.
- Growing logs (class logs, `.jsonl` progress, nodedeck's own run files):
  copied up to the length recorded by the listing; what is appended later is
  reported as such, not as a change that blocks the verdict, once the node's
  first bytes are hashed again and found to be the ones copied (verify.py).

nodedeck's own files on a node (its run dir and its state databases) are named
so, whenever one of them blocks the verdict.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import sqlite3

from ops.decommission.classify import ENV_CLASS
from ops.decommission.inventory import Entry
from ops.errors import HostError
from ops.hosts.base import Host
from ops.textsafe import last_line

SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
SIDECARS = ("-wal", "-shm", "-journal")
SNAPSHOT_MAX = 1 << 30  # bigger databases are copied as plain files

# Run by the node's python: the path (NUL-terminated) on stdin; out: the snapshot's sha256, a
# newline, then the snapshot. Exit 4: not a SQLite database; 5: too big for a snapshot here.
_SNAPSHOT_PY = r"""
import hashlib, os, sqlite3, sys, tempfile, urllib.parse
p = sys.stdin.buffer.read().rstrip(b"\0")
with open(p, "rb") as f:
    if f.read(16) != b"SQLite format 3\x00":
        sys.exit(4)
if os.path.getsize(p) > int(sys.argv[1]):
    sys.exit(5)
src = sqlite3.connect("file:" + urllib.parse.quote(os.fsdecode(p)) + "?mode=ro", uri=True)
if hasattr(sqlite3.Connection, "serialize"):
    dst = sqlite3.connect(":memory:")
    src.backup(dst)
    data = dst.serialize()
else:
    with tempfile.TemporaryDirectory() as d:
        dst = sqlite3.connect(os.path.join(d, "s.sqlite"))
        src.backup(dst)
        dst.close()
        data = open(os.path.join(d, "s.sqlite"), "rb").read()
out = sys.stdout.buffer
out.write(hashlib.sha256(data).hexdigest().encode() + b"\n")
out.write(data)
"""


def is_sqlite_name(path: str) -> bool:
    return path.lower().endswith(SQLITE_SUFFIXES)


def sqlite_sidecars(paths: set[str]) -> dict[str, str]:
    """sidecar path -> its database's path, for every database whose sidecars were listed."""
    out = {}
    for p in paths:
        for suffix in SIDECARS:
            if p.endswith(suffix) and is_sqlite_name(p[: -len(suffix)]) and p[: -len(suffix)] in paths:
                out[p] = p[: -len(suffix)]
    return out


def is_growing(e: Entry) -> bool:
    """Appended to while it lives: copied up to the length listed (never a file of nodedeck's own environment)."""
    return e.cls != ENV_CLASS and (e.cls == "logs" or (e.cls == "progress" and e.path.lower().endswith(".jsonl"))
                                   or own_kind(e.path) == "stage file")


def own_kind(path: str) -> str | None:
    """What a nodedeck file on the node is ("stage file", "state database"), or None when not its own."""
    parts = path.split("/")
    if ".nodedeck" in parts[:-1]:
        return "stage file"
    name = parts[-1].split("-")[0] if parts[-1].endswith(SIDECARS) else parts[-1]
    if len(parts) >= 3 and parts[-3:-1] == ["nodedeck", "nodes"] and name.endswith(".sqlite"):
        return "state database"
    return None


class SnapshotRefused(HostError):
    """The file could not be snapshotted (not SQLite, no python, too big): copy it as a plain file."""


def sqlite_snapshot(host: Host, python: str, node_path: str) -> tuple[bytes, str]:
    """A consistent copy of a live SQLite database taken on the node: (bytes, sha256 computed there)."""
    name = node_path.encode("utf-8", "surrogateescape") + b"\0"
    try:
        res = host.run([python, "-c", _SNAPSHOT_PY, str(SNAPSHOT_MAX)], input=name, timeout=600,
                       max_output=SNAPSHOT_MAX + 100)   # the digest line, then at most SNAPSHOT_MAX bytes
    except HostError as e:
        raise SnapshotRefused(str(e)) from e
    if res.returncode == 4:
        raise SnapshotRefused("not a SQLite database")
    if res.returncode == 5:
        raise SnapshotRefused(f"bigger than {SNAPSHOT_MAX >> 20} MiB")
    if res.returncode != 0:
        raise SnapshotRefused(f"{python}: {last_line(res.stderr) or f'exit {res.returncode}'}")
    digest, _, data = res.stdout.partition(b"\n")
    if hashlib.sha256(data).hexdigest() != digest.decode(errors="replace"):
        raise HostError(f"{posixpath.basename(node_path)}: the snapshot arrived damaged")
    return data, digest.decode()


def snapshot_fault(fd: int, listed: int) -> str | None:
    """What is wrong with the snapshot whose bytes the open descriptor `fd` reads (here, on this machine),
    for a database file listed at `listed` bytes; None when it is a sound copy of it."""
    size = os.fstat(fd).st_size
    if size == 0:
        return "the node's snapshot of this SQLite database holds 0 bytes: not a database"
    try:  # immutable: read as it is, no lock, no -wal or -shm made beside it
        db = sqlite3.connect(f"file:/proc/self/fd/{fd}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error as e:
        return f"the node's snapshot of this SQLite database does not open here: {e}"
    try:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        checked = [str(row[0]) for row in db.execute("PRAGMA integrity_check(5)").fetchall()]
    except sqlite3.Error as e:
        checked = [str(e)]
    finally:
        db.close()
    if checked != ["ok"]:
        said = "; ".join(checked)[:300]
        return f"the node's snapshot of this SQLite database fails PRAGMA integrity_check here: {said}"
    if pages * page_size != size:
        return (f"the node's snapshot of this SQLite database holds {size} bytes, not its {pages} pages of "
                f"{page_size}")
    if size < listed:
        return (f"the node's snapshot of this SQLite database holds fewer bytes than the file listed ({size} < "
                f"{listed}): not a copy of it")
    return None


_PREFIX_SH = 'IFS= read -r -d "" p; head -c "$1" -- "$p" | sha256sum; exit ${PIPESTATUS[0]}'


def prefix_digest(host: Host, node_path: str, length: int) -> str:
    """sha256 of the first `length` bytes of a node file, computed on the node."""
    res = host.run(["bash", "-c", _PREFIX_SH, "nodedeck-prefix", str(length)],
                   input=node_path.encode("utf-8", "surrogateescape") + b"\0", timeout=120 + length / (40 << 20))
    digest = res.stdout[:64].decode(errors="replace")
    if res.returncode != 0 or len(digest) != 64:
        raise HostError(last_line(res.stderr) or f"sha256 of the first {length} bytes failed (exit {res.returncode})")
    return digest

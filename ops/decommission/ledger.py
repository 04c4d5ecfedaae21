"""What earlier runs verified, so a resumed download hashes nothing already proven.

A file is proven when its sha256 here equalled the node's. The proof records the node's file as listed
(size, mtime, ctime, inode: what a copy or a rewrite cannot keep all of) and the local copy's own
(size, mtime, ctime, inode). A later run that finds both unchanged takes the proof instead of hashing
the file again on either end; anything changed on either side, and the file is checked as usual.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ops.decommission.inventory import Entry
from ops.decommission.localtree import DestTree, read_top

LEDGER = ".nodedeck-verified.json"
FORMAT = "nodedeck-verified/1"

Key = tuple[int, int, int, int]


@dataclass(frozen=True)
class Proof:
    sha256: str
    node: Key
    local: Key


def node_key(e: Entry) -> Key:
    return (e.size, e.mtime_ns, e.ctime_ns, e.inode)


def local_key(st: os.stat_result) -> Key:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _key(value: object) -> Key | None:
    if isinstance(value, list) and len(value) == 4 and all(type(v) is int for v in value):
        return (value[0], value[1], value[2], value[3])
    return None


def load(tree: DestTree) -> dict[str, Proof]:
    """The proofs an earlier run left (none when the ledger is missing or not this format)."""
    raw = read_top(tree, LEDGER)
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("files"), dict):
        return {}
    out = {}
    for path, rec in doc["files"].items():
        if not isinstance(rec, dict):
            continue
        sha, node, local = rec.get("sha256"), _key(rec.get("node")), _key(rec.get("local"))
        if isinstance(sha, str) and len(sha) == 64 and node is not None and local is not None:
            out[path] = Proof(sha, node, local)
    return out


def save(tree: DestTree, proofs: dict[str, Proof]) -> None:
    doc = {"format": FORMAT, "files": {p: {"sha256": v.sha256, "node": list(v.node), "local": list(v.local)}
                                       for p, v in sorted(proofs.items())}}
    tree.write_top(LEDGER, json.dumps(doc, ensure_ascii=True).encode())

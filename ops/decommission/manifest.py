"""manifest.json: every file the node held, where it is preserved, and whether that was verified."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from ops.decommission.inventory import summarize
from ops.decommission.policy import Action

if TYPE_CHECKING:
    from ops.decommission.results import Verdict
    from ops.decommission.wizard import Decommission

FORMAT = "nodedeck-decommission/1"


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def file_record(d: "Decommission", fs) -> dict:
    e = fs.entry
    if fs.action == Action.DOWNLOAD:
        source = f"files/{e.path}"
    elif fs.action == Action.IN_SNAPSHOT:  # a SQLite -wal/-shm: folded into its database's snapshot
        source = f"files/{d.sidecars[e.path]}"
    elif fs.action == Action.IN_S3 and d.s3_loc is not None:
        source = d.s3_loc.object_url(e.path)
    else:
        source = None
    return {
        "path": e.path,
        "class": e.cls,
        "size": e.size,
        "sha256": fs.job.node_sha256 if fs.job is not None else None,
        "md5": fs.s3.node_md5 if fs.s3 is not None and fs.s3.node_md5 else None,
        "source": source,
        "verified": fs.verified,
        "verified_by": fs.how if fs.verified else None,
        "action": fs.action,
        "reason": fs.reason or None,
        "s3": None if fs.s3 is None else {"status": fs.s3.status, "key": fs.s3.key, "etag": fs.s3.etag,
                                          "size": fs.s3.s3_size},
        "node_path": e.node_path,
        "preserved_bytes": fs.job.limit if fs.job is not None and fs.job.limit is not None else None,
        "sqlite_snapshot": fs.snapshot,
        "mode": f"{e.mode:04o}",
        "mtime": e.mtime_ns / 1e9,
    }


def build_manifest(d: "Decommission", v: "Verdict") -> dict:
    inv = d.listing
    outside = {link.path for link in d.outside}
    return {
        "format": FORMAT,
        "node": d.node,
        "created_at": _iso(time.time()),
        "started_at": _iso(d.started_at),
        "dest": str(d.dest),
        "layout": "files/<path>; the first root's files at the top, other roots under their label",
        "s3": d.s3_loc.url if d.s3_loc else None,
        "transfer": d.transfer_note,
        "verdict": {"safe": v.safe, "headline": v.headline, "counts": v.counts.to_json(),
                    "missing": [m.to_json() for m in v.missing], "warnings": list(v.warnings)},
        "inventory": summarize(inv),
        "policies": dict(d.policies),
        "files": [file_record(d, fs) for _, fs in sorted(d.files.items())],
        "links": [{"path": link.path, "target": link.target, "verified": d.links_done.get(link.path) == "",
                   "target_preserved": link.path not in outside}
                  for link in inv.links],
        "dirs": [{"path": x.path, "mode": f"{x.mode:04o}", "mtime": x.mtime_ns / 1e9} for x in inv.dirs],
    }


def manifest_bytes(d: "Decommission", verdict: "Verdict") -> bytes:
    """The manifest as UTF-8 JSON (ASCII escapes when a node path is not valid UTF-8)."""
    m = build_manifest(d, verdict)
    try:
        return (json.dumps(m, indent=2, ensure_ascii=False, default=str) + "\n").encode()
    except UnicodeEncodeError:
        return (json.dumps(m, indent=2, default=str) + "\n").encode()

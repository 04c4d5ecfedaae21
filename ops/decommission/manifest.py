"""manifest.json: every file the node held, where it is preserved, and whether that was verified."""

from __future__ import annotations

import json
import time

from ops.decommission.results import DecommissionResult, FileRecord

FORMAT = "nodedeck-decommission/1"


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def file_record(f: FileRecord) -> dict:
    return {
        "path": f.path,
        "class": f.cls,
        "size": f.size,
        "sha256": f.node_sha256,
        "md5": f.s3.node_md5 if f.s3 is not None and f.s3.node_md5 else None,
        "source": f.source,
        "verified": f.verified,
        "verified_by": f.verification if f.verified else None,
        "action": f.action,
        "reason": f.reason or None,
        "s3": None if f.s3 is None else {"status": f.s3.status, "key": f.s3.key, "etag": f.s3.etag,
                                         "size": f.s3.s3_size},
        "node_path": f.node_path,
        "preserved_bytes": f.preserved_bytes,
        "sqlite_snapshot": f.snapshot,
        "mode": f"{f.mode:04o}",
        "mtime": f.mtime_ns / 1e9,
    }


def build_manifest(r: DecommissionResult) -> dict:
    v = r.verdict
    return {
        "format": FORMAT,
        "node": r.node,
        "created_at": _iso(r.finished_at),
        "started_at": _iso(r.started_at),
        "dest": str(r.dest),
        "layout": "files/<path>; the first root's files at the top, other roots under their label",
        "s3": r.s3_url,
        "transfer": r.transfer_note,
        "verdict": {"safe": v.safe, "headline": v.headline, "counts": v.counts.to_json(),
                    "missing": [m.to_json() for m in v.missing], "warnings": list(v.warnings)},
        "inventory": r.inventory.to_json(),
        "policies": dict(r.policies),
        "files": [file_record(f) for f in r.files],
        "links": [{"path": x.path, "target": x.target, "verified": x.verified, "target_preserved": x.target_preserved}
                  for x in r.links],
        "dirs": [{"path": x.path, "mode": f"{x.mode:04o}", "mtime": x.mtime_ns / 1e9} for x in r.dirs],
    }


def manifest_bytes(r: DecommissionResult) -> bytes:
    """The manifest as UTF-8 JSON (ASCII escapes when a node path is not valid UTF-8)."""
    m = build_manifest(r)
    try:
        return (json.dumps(m, indent=2, ensure_ascii=False, default=str) + "\n").encode()
    except UnicodeEncodeError:
        return (json.dumps(m, indent=2, default=str) + "\n").encode()

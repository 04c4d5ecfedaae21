"""The verdict: SAFE TO SHUT DOWN only when every selected file is verified (here or in S3) and nothing
else is wrong; and what the notes record of each file, as frozen records."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping

from ops.decommission import s3 as s3mod
from ops.decommission.classify import ENV_CLASS
from ops.decommission.filestate import FileState
from ops.decommission.inventory import Rejected
from ops.decommission.links import OutsideLink
from ops.decommission.live import own_kind
from ops.decommission.localtree import DestTree
from ops.decommission.policy import Action
from ops.decommission.results import (
    Counts,
    Excluded,
    FileRecord,
    Fix,
    FixKind,
    MetricsLine,
    Missing,
    SafetyVerdict,
    with_cli_fix,
)
from ops.decommission.selection import s3_verified
from ops.decommission.verification import Verification
from ops.errors import HostError
from ops.hosts.base import Host

METRICS_TAIL = 64 << 10
# an S3 object's comparison -> how it verifies the file (any other match is by size only)
S3_VERIFICATION = {s3mod.MD5_MATCH: Verification.S3_MD5, s3mod.CHECKSUM_MATCH: Verification.S3_SHA256}


@dataclass(frozen=True)
class Findings:
    """What, beyond the files themselves, the verdict weighs."""

    dry_run: bool
    trust_s3_size: bool
    accept_outside_links: bool
    links_done: Mapping[str, str]  # path -> "" when recreated, else the error
    appeared: tuple[str, ...]
    problems: tuple[str, ...]
    rejected: tuple[Rejected, ...]
    outside: tuple[OutsideLink, ...]
    cancelled: bool
    grown: int
    warnings: tuple[str, ...]


def decide(files: Mapping[str, FileState], sidecars: Mapping[str, str], f: Findings) -> SafetyVerdict:
    """Each file's verification settled (S3 matches, snapshot sidecars, changes), then the verdict."""
    missing: list[Missing] = []
    excluded: list[Excluded] = []
    for path, fs in sorted(files.items()):
        if fs.action == Action.EXCLUDED:
            excluded.append(Excluded(path, fs.entry.cls, fs.entry.size))
            continue
        if fs.action == Action.IN_SNAPSHOT:
            db = files[sidecars[path]]
            fs.verified, fs.verification = db.verified, Verification.SQLITE_SNAPSHOT
            fs.reason = "" if db.verified else f"in the snapshot of {db.entry.path}, which is not preserved"
        if fs.action == Action.IN_S3 and fs.s3 is not None:
            fs.verification = S3_VERIFICATION.get(fs.s3.status, Verification.S3_SIZE)
            fs.verified = s3_verified(fs.s3, f.trust_s3_size)
            if not fs.verified:
                fs.reason = f"in S3 by size only ({fs.s3.detail}): unverified"
                fs.fix = Fix(FixKind.TRUST_S3_SIZE, fs.entry.cls)
        if fs.changed and not fs.reason.startswith("changed during download"):
            fs.verified = False
            fs.reason = f"changed during download: {fs.changed}" + (f"; {fs.reason}" if fs.reason else "")
        if not fs.verified and not f.dry_run:
            reason = fs.reason or "not downloaded"
            own = own_kind(path) if fs.entry.cls != ENV_CLASS else None  # its environment: node setup remakes it
            if own:
                reason += f" (nodedeck's own {own}: stop its stages or `nodedeck` on the node, then run again)"
            missing.append(Missing(reason, path, fs.entry.cls, fs.entry.size, fs.fix))
    if not f.dry_run:
        missing += [Missing(err, p, "symlink") for p, err in sorted(f.links_done.items()) if err]
        missing += [Missing("appeared on the node after the listing: not preserved (run again)", p)
                    for p in f.appeared]
        missing += [Missing(p) for p in f.problems]
        missing += [Missing(bad.reason, bad.name) for bad in f.rejected]
        if not f.accept_outside_links:
            missing += [Missing(f"symlink to {link.target} (on the node: {link.leads_to}), outside the preserved "
                                "roots: the link is recreated here, the data it points to is not preserved",
                                link.path, "symlink", fix=Fix(FixKind.ADD_ROOT, link.leads_to))
                        for link in f.outside]
        if f.cancelled:
            missing.append(Missing("cancelled"))
    states = files.values()
    counts = Counts(
        files=sum(fs.action != Action.EXCLUDED for fs in states),
        verified=sum(fs.verified for fs in states if fs.action != Action.EXCLUDED),
        verified_local=sum(fs.verified and fs.action == Action.DOWNLOAD for fs in states),
        verified_s3_md5=sum(fs.verified and fs.verification == Verification.S3_MD5 for fs in states),
        verified_s3_sha256=sum(fs.verified and fs.verification == Verification.S3_SHA256 for fs in states),
        s3_size_only=sum(fs.action == Action.IN_S3 and fs.verification == Verification.S3_SIZE for fs in states),
        s3_size_only_trusted=sum(fs.verified and fs.verification == Verification.S3_SIZE for fs in states),
        sqlite_snapshots=sum(fs.snapshot and fs.verified for fs in states),
        in_sqlite_snapshot=sum(fs.action == Action.IN_SNAPSHOT and fs.verified for fs in states),
        grown_logs=f.grown,
        excluded=len(excluded),
        missing=len(missing),
    )
    return SafetyVerdict(not f.dry_run and not missing, f.dry_run, tuple(missing), tuple(excluded), counts,
                         f.warnings)


def file_records(files: Mapping[str, FileState], sidecars: Mapping[str, str],
                 s3_url: Callable[[str], str] | None) -> tuple[FileRecord, ...]:
    """Every file as the run left it, sorted by path; `s3_url(path)` is its object's URL (None: no S3)."""
    out = []
    for _, fs in sorted(files.items()):
        e = fs.entry
        if fs.action == Action.DOWNLOAD:
            source: str | None = f"files/{e.path}"
        elif fs.action == Action.IN_SNAPSHOT:  # a SQLite -wal/-shm: folded into its database's snapshot
            source = f"files/{sidecars[e.path]}"
        elif fs.action == Action.IN_S3 and s3_url is not None:
            source = s3_url(e.path)
        else:
            source = None
        job = fs.job
        out.append(FileRecord(
            path=e.path, cls=e.cls, size=e.size, node_path=e.node_path, mode=e.mode, mtime_ns=e.mtime_ns,
            action=fs.action, source=source, verified=fs.verified, verification=fs.verification,
            reason=with_cli_fix(fs.reason, fs.fix),
            node_sha256=job.node_sha256 if job is not None else None, s3=fs.s3,
            preserved_bytes=job.limit if job is not None else None, snapshot=fs.snapshot))
    return tuple(out)


def last_metrics(files: Mapping[str, FileState], tree: Callable[[], DestTree], host: Host,
                 node_down: str | None) -> tuple[MetricsLine, ...]:
    """The last line of every metrics JSONL found: from the local copy when verified, else the node's."""
    out = []
    for path, fs in sorted(files.items()):
        name = path.rsplit("/", 1)[-1].lower()
        if not (name.endswith(".jsonl") and "metrics" in name):
            continue
        e = fs.entry
        start = max(0, e.size - METRICS_TAIL)
        try:
            if fs.verified and fs.action == Action.DOWNLOAD:
                with tree().open_read(path) as fd:
                    data = os.pread(fd, e.size - start, start)
            elif node_down:
                out.append(MetricsLine(path, f"(not preserved; node unreachable: {node_down})"))
                continue
            else:
                data = host.read_range(e.node_path, start, METRICS_TAIL)
        except (OSError, HostError) as err:
            out.append(MetricsLine(path, f"(unreadable: {err})"))
            continue
        lines = [x for x in data.decode(errors="replace").splitlines() if x.strip()]
        out.append(MetricsLine(path, lines[-1] if lines else "(empty)"))
    return tuple(out)

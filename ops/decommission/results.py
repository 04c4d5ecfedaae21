"""What each step of a decommission yields, as frozen records: the CLI, the TUI and the notes render these.

`Decommission.advance()` runs the next group of steps and returns one of
`Listed` (inventory + selection), `Planned` (after the S3 check: what the
download will do) or `Finished` (the verdict). `DecommissionResult` is the
whole run once its verdict is decided, which PROGRESS.md and manifest.json
are rendered from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from ops.decommission.classify import ENV_CLASS
from ops.decommission.inputs import StageStates
from ops.decommission.inventory import InventorySummary
from ops.decommission.policy import Action, Policy
from ops.decommission.s3 import S3Match
from ops.decommission.sysinfo import SystemSummary
from ops.decommission.verification import Verification


@dataclass(frozen=True)
class ClassRow:
    """One class of files: its policy, what it holds, and (once resolved) what happens to its files."""

    cls: str
    policy: Policy
    files: int = 0
    bytes: int = 0
    download: int = 0
    in_s3: int = 0
    excluded: int = 0
    in_snapshot: int = 0  # SQLite -wal/-shm folded into their database's snapshot
    download_bytes: int = 0


@dataclass(frozen=True)
class Selection:
    rows: tuple[ClassRow, ...]

    def row(self, cls: str) -> ClassRow:
        return next(r for r in self.rows if r.cls == cls)

    @property
    def present(self) -> tuple[ClassRow, ...]:
        """The classes that hold files."""
        return tuple(r for r in self.rows if r.files)

    def to_json(self) -> dict:
        return {"classes": {r.cls: {k: v for k, v in dataclasses.asdict(r).items() if k != "cls"}
                            for r in self.rows}}


@dataclass(frozen=True)
class DownloadPlan:
    files: int
    bytes: int
    in_s3: int
    excluded: int
    dest: Path

    def to_json(self) -> dict:
        return {"download_files": self.files, "download_bytes": self.bytes, "in_s3": self.in_s3,
                "excluded": self.excluded, "dest": str(self.dest)}


class FixKind(StrEnum):
    """A way the user settles something not preserved, which each face says in its own words."""

    ADD_ROOT = "add-root"  # a symlink out of the roots: preserve where it ends (value: that path), or accept it
    TRUST_S3_SIZE = "trust-s3-size"  # in S3 by size only: trust the size, or download the class (value: the class)


@dataclass(frozen=True)
class Fix:
    kind: FixKind
    value: str


def with_cli_fix(reason: str, fix: Fix | None) -> str:
    """The reason and, when there is one, the command line's way to settle it (the CLI, its JSON, the notes)."""
    if fix is None:
        return reason
    if fix.kind == FixKind.ADD_ROOT:
        return f"{reason} (add --root {fix.value} to keep it, or accept it: --accept-outside-links)"
    return f"{reason}; pass --trust-s3-size to accept, or --include {fix.value} to download"


@dataclass(frozen=True)
class Missing:
    """Something not preserved: a file (path and class), or a problem beyond files (path ''); `fix`: how the
    user may settle it, said by each face in its own words (the reason says only what is wrong)."""

    reason: str
    path: str = ""
    cls: str = ""
    size: int = 0
    fix: Fix | None = None

    @property
    def said(self) -> str:
        """The reason with the command line's way to settle it."""
        return with_cli_fix(self.reason, self.fix)

    def to_json(self) -> dict:
        return {"path": self.path, "class": self.cls, "size": self.size, "reason": self.said}


@dataclass(frozen=True)
class Excluded:
    path: str
    cls: str
    size: int

    def to_json(self) -> dict:
        return {"path": self.path, "class": self.cls, "size": self.size}


@dataclass(frozen=True)
class Counts:
    files: int = 0  # selected (not excluded)
    verified: int = 0  # of those: preserved and verified, wherever
    verified_local: int = 0
    verified_s3_md5: int = 0
    verified_s3_sha256: int = 0
    s3_size_only: int = 0
    s3_size_only_trusted: int = 0
    sqlite_snapshots: int = 0
    in_sqlite_snapshot: int = 0
    grown_logs: int = 0
    excluded: int = 0
    missing: int = 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SafetyVerdict:
    """Whether the node may be shut down: SAFE only when nothing selected is missing."""

    safe: bool
    dry_run: bool
    missing: tuple[Missing, ...]
    excluded: tuple[Excluded, ...]
    counts: Counts
    warnings: tuple[str, ...] = ()  # handled, but worth saying (skipped FIFOs, kind changes, grown logs)

    @property
    def headline(self) -> str:
        if self.dry_run:
            return "DRY RUN: nothing was preserved"
        if self.safe:
            return "SAFE TO SHUT DOWN"
        files, verified = self.counts.files, self.counts.verified
        others = len(self.missing) - (files - verified)
        parts = [f"{files - verified} file(s)"] if files > verified else []
        parts += [f"{others} other item(s)"] if others else []
        return f"NOT SAFE TO SHUT DOWN: {verified} of {files} files verified; not preserved: {', '.join(parts)}"

    @property
    def excluded_bytes(self) -> int:
        return sum(x.size for x in self.excluded)

    @property
    def own_env(self) -> tuple[Excluded, ...]:
        """The files of nodedeck's own environment left out (`node setup` makes them again)."""
        return tuple(x for x in self.excluded if x.cls == ENV_CLASS)

    @property
    def by_choice(self) -> tuple[Excluded, ...]:
        """The user's files left out by a class policy."""
        return tuple(x for x in self.excluded if x.cls != ENV_CLASS)

    def to_json(self) -> dict:
        return {"safe": self.safe, "dry_run": self.dry_run, "headline": self.headline,
                "missing": [m.to_json() for m in self.missing], "excluded": [x.to_json() for x in self.excluded],
                "counts": self.counts.to_json(), "warnings": list(self.warnings)}


@dataclass(frozen=True)
class Listed:
    """After the inventory and the selection."""

    selection: Selection
    inventory: InventorySummary


@dataclass(frozen=True)
class Planned:
    """After the S3 check: every file's action decided."""

    selection: Selection
    plan: DownloadPlan


@dataclass(frozen=True)
class Finished:
    selection: Selection
    verdict: SafetyVerdict


StepResult = Listed | Planned | Finished


@dataclass(frozen=True)
class FileRecord:
    """One inventoried file as the run left it: where it is preserved, and whether that was verified."""

    path: str
    cls: str
    size: int
    node_path: str
    mode: int
    mtime_ns: int
    action: Action
    source: str | None  # files/<path> or the S3 object's URL; None when not preserved
    verified: bool
    verification: Verification | None
    reason: str
    node_sha256: str | None
    s3: S3Match | None
    preserved_bytes: int | None  # a growing file: the length listed, which is what was preserved
    snapshot: bool


@dataclass(frozen=True)
class LinkRecord:
    path: str
    target: str
    verified: bool  # recreated here
    target_preserved: bool  # the link leads inside the roots


@dataclass(frozen=True)
class DirRecord:
    path: str
    mode: int
    mtime_ns: int


@dataclass(frozen=True)
class MetricsLine:
    """The last line of a metrics JSONL (or why there is none)."""

    path: str
    line: str


@dataclass(frozen=True)
class DecommissionResult:
    """A finished run, frozen: what PROGRESS.md and manifest.json are rendered from."""

    node: str
    dest: Path
    started_at: float
    finished_at: float  # when the notes were written
    verdict: SafetyVerdict
    inventory: InventorySummary
    selection: Selection
    policies: tuple[tuple[str, Policy], ...]  # class -> policy, in class order
    files: tuple[FileRecord, ...]  # sorted by path
    links: tuple[LinkRecord, ...]
    dirs: tuple[DirRecord, ...]
    stage_states: StageStates
    metrics: tuple[MetricsLine, ...]
    transfer_note: str
    s3_url: str | None
    s3_objects: int
    sysinfo: SystemSummary | None
    warnings: tuple[str, ...]

"""What is preserved how: each file's Action from its class Policy and its S3 match, and the Selection
table (per class: policy, files, bytes, and what happens to them)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from ops.decommission import s3 as s3mod
from ops.decommission.classify import CLASSES
from ops.decommission.filestate import FileState
from ops.decommission.policy import Action, Policy
from ops.decommission.results import ClassRow, DownloadPlan, Selection


def s3_verified(match: s3mod.S3Match | None, trust_size: bool) -> bool:
    """An S3 object counts as the file's preserved copy: its content matched (or its size, when trusted)."""
    return match is not None and (match.status in s3mod.CONTENT_MATCHES
                                  or (match.status == s3mod.SIZE_ONLY and trust_size))


def resolve(files: Mapping[str, FileState], policies: Mapping[str, Policy], sidecars: Mapping[str, str],
            no_snapshot: set[str]) -> None:
    """Decide each file's action from its class policy and its S3 match; a SQLite sidecar whose database
    is downloaded (as a snapshot: not one of `no_snapshot`) is folded into that snapshot."""
    for fs in files.values():
        policy = policies[fs.entry.cls]
        if policy == Policy.SKIP:
            fs.action = Action.EXCLUDED
        elif policy == Policy.PRESERVE:
            fs.action = Action.DOWNLOAD
        elif fs.s3 is not None and fs.s3.status in (*s3mod.CONTENT_MATCHES, s3mod.SIZE_ONLY):
            fs.action = Action.IN_S3
        else:
            fs.action = Action.DOWNLOAD
    for side, db in sidecars.items():
        if db not in no_snapshot and files[side].action == files[db].action == Action.DOWNLOAD:
            files[side].action = Action.IN_SNAPSHOT


def selection(files: Mapping[str, FileState], policies: Mapping[str, Policy]) -> Selection:
    """Per class: policy, files, bytes, and (once resolved) what happens to them."""
    rows = []
    for c in CLASSES:
        mine = [fs for fs in files.values() if fs.entry.cls == c]
        n = {a: sum(fs.action == a for fs in mine) for a in Action}
        rows.append(ClassRow(c, policies[c], len(mine), sum(fs.entry.size for fs in mine),
                             n[Action.DOWNLOAD], n[Action.IN_S3], n[Action.EXCLUDED], n[Action.IN_SNAPSHOT],
                             sum(fs.entry.size for fs in mine if fs.action == Action.DOWNLOAD)))
    return Selection(tuple(rows))


def download_plan(files: Mapping[str, FileState], dest: Path) -> DownloadPlan:
    """What the download step will do with the actions decided now."""
    down = [fs for fs in files.values() if fs.action == Action.DOWNLOAD]
    return DownloadPlan(len(down), sum(fs.entry.size for fs in down),
                        sum(fs.action == Action.IN_S3 for fs in files.values()),
                        sum(fs.action == Action.EXCLUDED for fs in files.values()), dest)

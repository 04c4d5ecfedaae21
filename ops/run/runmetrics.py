"""Every run of a stage keeps its metrics: before a stage runs again, the metrics JSONL its last run of
the same variant wrote is copied beside it as `<name>.run<ID>.jsonl` (ID: that run's id), so the
dashboard can lay the previous run over the current one after a rerun or a restart of nodedeck.
The newest KEEP copies of each variant are kept."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Sequence

from ops.hosts.base import shell_path
from ops.state import RunRecord

KEEP = 3


@dataclass(frozen=True)
class EarlierRun:
    """A run of a stage before its latest one, and where its metrics are now."""

    run: RunRecord
    number: int
    """Its place among the stage's runs, from 1 (`run 3`: the stage's third run)."""
    path: str
    """Its metrics JSONL: the live file while it is its variant's latest run, else the kept copy."""


def archived(path: str, run_id: int) -> str:
    """Where the metrics file `path` of run `run_id` is kept once the stage ran again."""
    stem, ext = posixpath.splitext(path)
    return f"{stem}.run{run_id}{ext}"


def keep_script(path: str, runs: Sequence[RunRecord]) -> str:
    """Shell for the node, run just before a new run of the variant whose earlier runs are `runs` (oldest
    first): copy the last one's metrics file to its archive name, drop archives beyond the newest KEEP.
    It never fails: a copy that cannot be made costs only the overlay."""
    if not runs:
        return "true"
    live, last = shell_path(path), shell_path(archived(path, runs[-1].id))
    # each launch drops the copy that just fell out, so older ones are gone already: a bounded command line
    stale = [shell_path(archived(path, r.id)) for r in runs[:-KEEP][-KEEP:]]
    script = f"{{ [ ! -f {live} ] || cp -p -- {live} {last} || true; }}"
    return script + (f"; rm -f -- {' '.join(stale)}" if stale else "")


def metrics_of(path: str, run: RunRecord, runs: Sequence[RunRecord]) -> str:
    """The file holding run's metrics, `path` being its variant's metrics output and `runs` every run of
    the stage: the live file for the variant's latest run, the archived copy for an earlier one."""
    latest = max(r.id for r in runs if r.smoke == run.smoke)
    return path if run.id == latest else archived(path, run.id)

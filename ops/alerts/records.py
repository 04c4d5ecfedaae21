"""Typed alerts and their thresholds.

An alert is a condition on one node that people noticed too late in real runs: speculation
slower than no speculation, a served acceptance that collapsed (near 1, or far under the eval's),
loss resets, idle GPUs under a running stage, a stalled stage, a disk that fills before the stage
ends, a node about to be retired with files not preserved.
Each carries a clear message, the evidence (the numbers it stands on) and since when.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from ops.errors import UserError


class AlertKind(str, enum.Enum):
    SPEC_SLOWER = "spec_slower"            # speedup vs the measured baseline < 1.0
    ACCEPT_LOW = "accept_low"              # acceptance length under the plan's floor
    ACCEPT_COLLAPSED = "accept_collapsed"  # acceptance near 1 while speculating, or far under the eval's
    LOSS_RESETS = "loss_resets"            # periodic jumps in loss/accuracy (homogeneous buckets)
    LOSS_NAN = "loss_nan"                  # loss NaN or inf
    LOSS_DIVERGING = "loss_diverging"      # loss rising well above its best
    GPU_IDLE = "gpu_idle"                  # GPUs idle while a stage runs
    STAGE_STALLED = "stage_stalled"        # a running stage's log/progress not advancing
    DISK_FULL_BEFORE_ETA = "disk_full_before_eta"
    RETIRE_UNPRESERVED = "retire_unpreserved"


class Severity(str, enum.Enum):
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True)
class Alert:
    node: str
    kind: AlertKind
    subject: str                           # what it is about: a stage, a metrics file, a disk, "gpus 0,1"
    message: str                           # one line, for people
    evidence: str                          # the numbers behind it
    severity: Severity = Severity.WARNING
    since: float | None = None             # when the condition was first seen (unix time)

    @property
    def key(self) -> str:
        """Identity across polls: the same condition on the same subject is the same alert."""
        return f"{self.node}/{self.kind.value}/{self.subject}"

    def to_json(self) -> dict:
        return {"node": self.node, "kind": self.kind.value, "subject": self.subject, "severity": self.severity.value,
                "message": self.message, "evidence": self.evidence, "since": self.since, "key": self.key}


@dataclass(frozen=True)
class Thresholds:
    """Alert thresholds; defaults here, overridden by a plan's `[alerts]` table or a node's `alerts` table."""

    min_speedup: float = 1.0               # speculation slower than this vs the baseline alerts
    min_accept_len: float | None = None    # acceptance length floor (None: no floor)
    collapsed_accept_len: float = 1.1      # served acceptance at or under this while speculating: collapsed
    min_accept_vs_eval: float = 0.5        # served accepted drafts per round under this share of the eval's
    collapse_hold_s: float = 60.0          # ... for this long (one quiet interval is not a collapse)
    gpu_idle_pct: float = 5.0              # utilisation under this counts as idle
    gpu_idle_s: float = 600.0              # ... for this long while a stage runs
    stall_s: float = 900.0                 # a running stage whose log and progress did not grow for this long
    disk_margin: float = 1.1               # the disk must last the stage's ETA times this
    reset_min_jumps: int = 3               # periodic jumps needed to call it loss resets
    retire_warn_s: float = 86400.0         # alert this long before a node's retire_after

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str, base: "Thresholds | None" = None) -> "Thresholds":
        """Thresholds from a TOML table; a bad key or value is one line naming `where` (file:line)."""
        base = base or cls()
        known = {f.name: f for f in fields(cls)}
        changes: dict[str, Any] = {}
        for key, value in table.items():
            if key not in known:
                raise UserError(f"{where}: unknown alert threshold {key!r}; known: {', '.join(sorted(known))}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e12:
                raise UserError(f"{where}: alert threshold {key} must be a number >= 0, got {value!r}")
            changes[key] = int(value) if key == "reset_min_jumps" else float(value)
        return replace(base, **changes)


def parse_when(text: str, where: str) -> float:
    """`2026-12-05T18:00` / `2026-12-05 18:00[:00][Z|+HH:MM]` (local time without a zone) -> unix time."""
    t = text.strip().replace(" ", "T", 1)
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", t):
        t += "T00:00"
    try:
        when = dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"{where}: expected a date and time like 2026-12-05T18:00, got {text!r}") from None
    return when.timestamp()

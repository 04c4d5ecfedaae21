"""A stage's whole recorded truth: one frozen `StageRecord`, stored as one row of the node's state.

The scheduler reads it at the start of each look at a stage and writes a new one
when something was decided: the current launch, the verdict on a run, the
verified smoke run, a skip, the server run that was seen up, and the state
last shown. Everything else (is the process alive, did the checks pass) comes
from the node each tick.

The store holds it as one stage_state row (the state last shown in its columns, the rest as JSON in
`record`), read and changed in one transaction (`load_record`, `update_record`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any, Mapping

from ops.run.views import CheckResult, StageState
from ops.state import StageStateRow, StateStore


class Why(str, enum.Enum):
    """Why a run's verdict was reached."""

    EXIT = "exit"                  # the run ended on its own (exit status, checks after a clean exit, lost)
    TIMEOUT = "timeout"            # it ran past its timeout and was stopped
    STOPPED = "stopped"            # the user stopped it
    VERIFIED = "verified"          # `verify` was asked for by the user
    LAUNCH_ERROR = "launch_error"  # it could not be launched at all


@dataclass(frozen=True)
class StageVerdict:
    """The settled outcome of one run (run None: a launch that failed before any run was recorded)."""

    run: int | None
    state: StageState
    detail: str
    why: Why
    results: tuple[CheckResult, ...] = ()

    @property
    def retryable(self) -> bool:
        """A failure that `retries` relaunches (never a user stop or a launch error)."""
        return self.state is StageState.FAILED and self.why in (Why.EXIT, Why.TIMEOUT)

    def to_json(self) -> dict:
        return {"run": self.run, "state": self.state.value, "detail": self.detail, "why": self.why.value,
                "results": [r.to_json() for r in self.results]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "StageVerdict":
        return cls(d.get("run"), StageState(d["state"]), str(d["detail"]), Why(d["why"]),
                   tuple(CheckResult.from_json(r) for r in d.get("results", ())))


@dataclass(frozen=True)
class RankRun:
    """One node's part of a launch on several nodes: its run (in that node's state) and tmux session."""

    node_name: str
    run: int
    tmux_session: str
    log_offset: int = 0

    def to_json(self) -> dict:
        return {"node": self.node_name, "run": self.run, "session": self.tmux_session, "log_offset": self.log_offset}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RankRun":
        return cls(str(d["node"]), int(d["run"]), str(d["session"]), int(d.get("log_offset", 0)))


@dataclass(frozen=True)
class Launch:
    """The stage's current run as launched: where its log began, the node's clock then, its PATH.

    On several nodes `run` is node-rank 0's run (on the stage's first node) and `ranks` lists every
    node-rank's, the first included."""

    run: int
    attempt: int
    smoke: bool
    log_offset: int = 0
    node_t0: float | None = None
    env_path: str | None = None     # the PATH the command had, as the run's wrapper recorded it
    ranks: tuple[RankRun, ...] = ()

    def to_json(self) -> dict:
        return {"run": self.run, "attempt": self.attempt, "smoke": self.smoke, "log_offset": self.log_offset,
                "node_t0": self.node_t0, "env_path": self.env_path, "ranks": [r.to_json() for r in self.ranks]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Launch":
        return cls(int(d["run"]), int(d.get("attempt", 1)), bool(d.get("smoke", False)),
                   int(d.get("log_offset", 0)), d.get("node_t0"), d.get("env_path"),
                   tuple(RankRun.from_json(r) for r in d.get("ranks") or ()))


@dataclass(frozen=True)
class LastShown:
    """The state last reported for the stage (what a restarted nodedeck shows before it can look)."""

    state: StageState
    detail: str = ""
    checks: tuple[CheckResult, ...] = ()
    smoke: bool = False
    attempt: int = 0


@dataclass(frozen=True)
class Skip:
    """The user's skip of a stage: it holds while `run` (its latest run then; None: it never ran) is."""

    run: int | None


@dataclass(frozen=True)
class Retry:
    """A failed run (or a server down that a stage still needs) to launch again once ready: it holds while
    `run` (the stage's latest run then; None: a launch that failed before any run) is the latest. The
    scheduler's `retry_failed`, which a resumed `nodedeck demo` asks for."""

    run: int | None


@dataclass(frozen=True)
class StageRecord:
    """Everything recorded about one stage of one plan on its node."""

    launch: Launch | None = None
    verdict: StageVerdict | None = None
    smoke_ok: int | None = None         # run id of the verified smoke run
    skip: Skip | None = None            # the user's skip, when the stage is skipped
    up: int | None = None               # run id of the server run that was seen healthy
    shown: LastShown | None = None
    retry: Retry | None = None          # launch it again once ready (a resumed demo's failed stages)

    def verdict_for(self, run_id: int | None) -> StageVerdict | None:
        return self.verdict if self.verdict is not None and self.verdict.run == run_id else None

    def launch_for(self, run_id: int) -> Launch | None:
        return self.launch if self.launch is not None and self.launch.run == run_id else None

    def skipped_at(self, run_id: int | None) -> bool:
        return self.skip is not None and self.skip.run == run_id

    def retry_at(self, run_id: int | None) -> bool:
        return self.retry is not None and self.retry.run == run_id

    def with_(self, **changes: Any) -> "StageRecord":
        return replace(self, **changes)

    def to_json(self) -> dict:
        """What is stored in the row's `record` column (the shown state has its own columns)."""
        return {"launch": self.launch.to_json() if self.launch else None,
                "verdict": self.verdict.to_json() if self.verdict else None,
                "smoke_ok": self.smoke_ok, "skip": {"run": self.skip.run} if self.skip else None, "up": self.up,
                "retry": {"run": self.retry.run} if self.retry else None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None, shown: LastShown | None = None) -> "StageRecord":
        d = d or {}
        return cls(Launch.from_json(d["launch"]) if d.get("launch") else None,
                   StageVerdict.from_json(d["verdict"]) if d.get("verdict") else None,
                   d.get("smoke_ok"), Skip(d["skip"]["run"]) if d.get("skip") else None, d.get("up"), shown,
                   Retry(d["retry"]["run"]) if d.get("retry") else None)


def record_of(row: StageStateRow | None) -> StageRecord:
    """The StageRecord a stage_state row holds (an empty record for no row)."""
    if row is None:
        return StageRecord()
    info = row.checks if isinstance(row.checks, dict) else {}
    shown = LastShown(StageState(row.state), row.detail or "",
                      tuple(CheckResult.from_json(r) for r in info.get("results", [])),
                      bool(info.get("smoke", False)), int(info.get("attempt", 0) or 0))
    return StageRecord.from_json(row.record, shown)


def row_of(stage_id: str, plan: str, record: StageRecord) -> StageStateRow:
    """The stage_state row of a record (a record never shown yet is recorded as pending)."""
    shown = record.shown or LastShown(StageState.PENDING, "not looked at yet")
    checks = {"results": [r.to_json() for r in shown.checks], "smoke": shown.smoke, "attempt": shown.attempt}
    return StageStateRow(stage_id, shown.state.value, shown.detail, 0.0, checks, plan, record.to_json())


def load_record(store: StateStore, plan: str, stage_id: str) -> StageRecord:
    """What the store holds about one stage of a plan."""
    return record_of(store.get_stage_state(plan, stage_id))


def update_record(store: StateStore, plan: str, stage_id: str, **changes: Any) -> StageRecord:
    """Change fields of a stage's record (none: just store it) in one transaction; the new record."""
    return record_of(store.modify_stage_state(
        plan, stage_id, lambda row: row_of(stage_id, plan, record_of(row).with_(**changes))))

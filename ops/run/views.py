"""The status records of a plan's run: where each stage stands (`StageView`, with its checks' results and
its ranks), what the scheduler reports (`PlanEvent`), and the todos beside the stages (`TodoItem`).

The scheduler (ops.run.scheduler) computes a stage's `StageView` from the node's StateStore and tmux on every
tick; the dashboard and `plan show` display it. Nothing here touches a host.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping

from ops.plan.records import Priority, StageKind
from ops.units import AGE, human_duration


class StageState(str, enum.Enum):
    """Where a stage stands. Only `completed` means every verify check passed."""

    PENDING = "pending"        # dependencies not yet satisfied
    READY = "ready"            # may be started now
    RUNNING = "running"        # process seen alive (and its log exists/advances)
    VERIFYING = "verifying"    # process exited 0 (job) or is up (server): checks being run
    COMPLETED = "completed"    # every verify check passed
    FAILED = "failed"          # exit != 0, timeout, or a check failed (detail names it)
    BLOCKED = "blocked"        # a dependency failed or is blocked
    SKIPPED = "skipped"        # skipped by the user; counts as satisfied for dependents

    @property
    def terminal(self) -> bool:
        """No further transition happens without a user action (start, restart, skip)."""
        return self in (StageState.COMPLETED, StageState.FAILED, StageState.BLOCKED, StageState.SKIPPED)

    @property
    def active(self) -> bool:
        """A process of this stage is (believed to be) alive on the node."""
        return self in (StageState.RUNNING, StageState.VERIFYING)

    @property
    def satisfies_dependents(self) -> bool:
        return self in (StageState.COMPLETED, StageState.SKIPPED)



@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check; `text` is one line such as `... : 1042 ✓`."""

    kind: str
    ok: bool
    text: str
    checked_at: float

    @property
    def body(self) -> str:
        """The text without its trailing ✓ or ✗ (shown leading, with the age: see `line`)."""
        body = self.text.rstrip()
        for glyph in (" ✓", " ✗"):
            body = body.removesuffix(glyph)
        return body

    def age(self, now: float) -> str:
        """`45s ago`, `3m ago`: how old the result is at `now` (whole minutes past the first one)."""
        return f"{human_duration(max(0.0, now - self.checked_at), AGE)} ago"

    def line(self, now: float) -> str:
        """`✓ 3m ago  http_ok ...: 200`: the result as printed, with its age (a pass is news only
        while it is fresh)."""
        return f"{'✓' if self.ok else '✗'} {self.age(now)}  {self.body}"

    def to_json(self) -> dict:
        return {"kind": self.kind, "ok": self.ok, "text": self.text, "checked_at": self.checked_at}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CheckResult":
        return cls(str(d["kind"]), bool(d["ok"]), str(d["text"]), float(d["checked_at"]))



@dataclass(frozen=True)
class RankView:
    """One node's part of a stage that runs on several nodes (its torchrun node-rank), as last seen."""

    node_rank: int
    node_name: str
    state: str = "not started"         # or its run's state: starting, running, exited, lost, failed
    pid: int | None = None
    exit_code: int | None = None
    stopped: bool = False

    def describe(self) -> str:
        """`gpu2 r1 running (pid 4242)`, `gpu2 r1 exit 1`, `gpu2 r1 stopped`; just `gpu2 r1` before it ran."""
        name = f"{self.node_name} r{self.node_rank}"
        if self.state == "not started":
            return name
        if self.state == "exited":
            return f"{name} {'stopped' if self.stopped else f'exit {self.exit_code}'}"
        if self.state in ("running", "starting") and self.pid is not None:
            return f"{name} {self.state} (pid {self.pid})"
        return f"{name} {self.state}"

    def to_json(self) -> dict:
        return {"node_rank": self.node_rank, "node": self.node_name, "state": self.state, "pid": self.pid,
                "exit_code": self.exit_code, "stopped": self.stopped}



@dataclass(frozen=True)
class StageView:
    """What the TUI and `plan show` display about one stage, at one tick."""

    id: str
    title: str
    priority: Priority
    depends_on: tuple[str, ...]
    kind: StageKind
    node_name: str
    state: StageState
    detail: str                        # one line: why this state ("exit 1", "✗ min_lines ...", "waiting for a, b")
    checks: tuple[CheckResult, ...] = ()   # results of the last verification, in verify order
    started_at: float | None = None    # of the current/last run
    ended_at: float | None = None
    attempt: int = 0                   # runs of the current variant launched so far (1 = first)
    smoke: bool = False                # the current/last run is the smoke variant
    has_smoke: bool = False
    smoke_verified: bool = False
    tmux_session: str | None = None    # tmux session name (TmuxRunner adds `nd-`)
    log_path: str | None = None
    exit_code: int | None = None
    env_path: str | None = None        # the PATH the run's command had (after the plan's env and setup)
    ranks: tuple[RankView, ...] = ()   # a stage on several nodes: each node's part (node is the first's)

    @property
    def down_after_up(self) -> bool:
        """A server stage that was up (completed: it did its part, its dependents may go on) whose run is over:
        it serves nothing now, and its checks fail for that reason."""
        return self.kind is StageKind.SERVER and self.state is StageState.COMPLETED and self.ended_at is not None

    def ranks_line(self) -> str:
        """`2 nodes: gpu1 r0 running (pid 11), gpu2 r1 running (pid 12)`; '' for a stage on one node."""
        if not self.ranks:
            return ""
        return f"{len(self.ranks)} nodes: " + ", ".join(r.describe() for r in self.ranks)

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "title": self.title,
            "priority": self.priority.value,
            "depends_on": list(self.depends_on),
            "kind": self.kind.value,
            "node": self.node_name,
            "state": self.state.value,
            "detail": self.detail,
            "checks": [c.to_json() for c in self.checks],
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "attempt": self.attempt,
            "smoke": self.smoke,
            "has_smoke": self.has_smoke,
            "smoke_verified": self.smoke_verified,
            "session": self.tmux_session,
            "log_path": self.log_path,
            "exit_code": self.exit_code,
            "env_path": self.env_path,
            "ranks": [r.to_json() for r in self.ranks],
        }



@dataclass(frozen=True)
class PlanEvent:
    """A transition or action the scheduler reports (printed headless, logged in the TUI)."""

    ts: float
    stage: str | None
    kind: str                          # "transition", "launch", "stop", "retry", "refused", "error"
    message: str                       # one line



@dataclass(frozen=True)
class TodoItem:
    """A todo beside the pipeline's stages: imported manual items or a followed AI list."""

    id: str
    content: str
    status: str                        # todowrite status: pending, in_progress, completed, cancelled
    priority: Priority = Priority.MEDIUM
    source: str = ""                   # file it came from

    def to_json(self) -> dict:
        return {"id": self.id, "content": self.content, "status": self.status, "priority": self.priority.value}


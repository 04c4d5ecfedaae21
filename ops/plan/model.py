"""The data a pipeline plan is made of, and the status records the UI shows.

A `Plan` is parsed from TOML (ops.plan.parse) and never changes; what changes
is each stage's `StageView`, which the scheduler (ops.plan.scheduler) computes
from the node's StateStore and tmux on every tick. Nothing here touches a host.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from ops.errors import UserError
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


class Priority(str, enum.Enum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"

    @property
    def rank(self) -> int:
        """0 for high: ready stages launch, and stages tied in dependency order are listed, lowest first."""
        return list(Priority).index(self)


class StageKind(str, enum.Enum):
    JOB = "job"          # runs to an exit; completed when it exited 0 and checks pass
    SERVER = "server"    # keeps running; completed when its checks pass while alive


CHECK_KINDS = (
    "file_exists",     # path
    "min_bytes",       # path, min
    "min_lines",       # path, min           (JSONL record / line count)
    "glob_count",      # pattern, min        (number of matching paths)
    "log_contains",    # pattern [, path]    (regex; default path: the stage's log)
    "log_advancing",   # within [, path]     (log grew within `within` seconds)
    "process_alive",   # [session]           (the stage's own run, or a named tmux session)
    "http_ok",         # url [, timeout]     (HTTP 200, fetched on the node)
    "json_field",      # path, field, op, value [, line = "last"|"first"|N]
    "command_ok",      # command [, timeout] (bash -c on the node exits 0)
)

JSON_OPS = ("<", "<=", ">", ">=", "==", "!=")

VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_.]*)(?::raw)?\}")
"""`${name}`, `${node.root}` or `${name:raw}`; substituted when a plan is resolved (ops.plan.shelltext)."""


def tcp_port(value: object) -> int | None:
    """`value` as a TCP port (an int, or ASCII digits, 1 to 65535), else None."""
    if isinstance(value, str) and value.isascii() and value.isdecimal() and len(value) <= 5:
        value = int(value)
    return value if type(value) is int and 0 < value < 65536 else None


def _frozen(d: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True)
class CheckSpec:
    """One verify check: its kind and the kind's arguments (validated by the parser)."""

    kind: str
    args: Mapping[str, Any] = field(default_factory=dict)
    line: int | None = None   # line in the plan file, for messages

    def __post_init__(self):
        object.__setattr__(self, "args", _frozen(self.args))

    def describe(self) -> str:
        """Short text naming what is checked, e.g. `min_lines data/x.jsonl >= 1000`."""
        a = self.args
        if self.kind == "file_exists":
            return f"file_exists {a['path']}"
        if self.kind in ("min_bytes", "min_lines"):
            return f"{self.kind} {a['path']} >= {a['min']}"
        if self.kind == "glob_count":
            return f"glob_count {a['pattern']} >= {a['min']}"
        if self.kind == "log_contains":
            where = f" in {a['path']}" if a.get("path") else ""
            return f"log_contains /{a['pattern']}/{where}"
        if self.kind == "log_advancing":
            where = f" {a['path']}" if a.get("path") else ""
            return f"log_advancing{where} within {a['within']:g}s"
        if self.kind == "process_alive":
            return f"process_alive {a.get('session') or '(this stage)'}"
        if self.kind == "http_ok":
            return f"http_ok {a['url']}"
        if self.kind == "json_field":
            line = a.get("line", "last")
            where = "" if line == "last" else f" (line {line})"
            return f"json_field {a['path']}{where} {a['field']} {a['op']} {a['value']}"
        if self.kind == "command_ok":
            return f"command_ok {a['command']}"
        return self.kind


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
class Upload:
    """A local file pushed to the node before the stage starts (parent dirs created)."""

    src: str
    dest: str


@dataclass(frozen=True)
class Smoke:
    """The small variant of a stage that must verify before the full run may start."""

    command: str                       # full smoke command (stage command + smoke_args when given so)
    verify: tuple[CheckSpec, ...]      # defaults to the stage's verify checks
    timeout: float | None = None


@dataclass(frozen=True)
class Stage:
    id: str
    title: str                         # the todo text, shown whole
    command: str
    priority: Priority = Priority.MEDIUM
    depends_on: tuple[str, ...] = ()
    node: str | None = None            # None: the plan's node
    nodes: tuple[str, ...] = ()        # several nodes: the command runs under torchrun on each (ops.plan.ranks)
    nproc_per_node: str = "1"          # torchrun --nproc-per-node on each of `nodes`: a number, gpu, cpu or auto
    rdzv_host: str | None = None       # the address of nodes[0] the others reach (default: ops.plan.ranks)
    cwd: str | None = None
    upload: tuple[Upload, ...] = ()
    outputs: tuple[str, ...] = ()
    timeout: float | None = None       # seconds; past it the run is stopped and failed
    retries: int = 0                   # extra attempts after a failure
    log: str | None = None             # default: <run_dir>/<session>.log
    env: Mapping[str, str] = field(default_factory=dict)
    setup: str | None = None           # shell line run before the command (after the plan's), e.g. a venv
    smoke: Smoke | None = None
    kind: StageKind = StageKind.JOB
    port: str | None = None            # a server's TCP port on its node ("8123", "${port}"; ops.plan.ports)
    verify: tuple[CheckSpec, ...] = ()
    todo: tuple[str, ...] = ()         # patterns of coding-agent todo items this stage backs
    line: int | None = None            # line of the [[stage]] header

    def __post_init__(self):
        object.__setattr__(self, "env", _frozen(self.env))


@dataclass(frozen=True)
class Plan:
    name: str
    stages: tuple[Stage, ...]
    description: str = ""
    node: str | None = None            # default node of every stage
    root: str | None = None            # `${root}`; default: the node's root
    vars: Mapping[str, str] = field(default_factory=dict)
    max_parallel: int | None = None    # per node; overrides the node config's
    path: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)   # every stage's environment (a stage's env wins)
    setup: str | None = None           # shell line run before every stage's command (PATH, venv, conda)

    def __post_init__(self):
        object.__setattr__(self, "vars", _frozen(self.vars))
        object.__setattr__(self, "env", _frozen(self.env))

    def stage(self, stage_id: str) -> Stage:
        for s in self.stages:
            if s.id == stage_id:
                return s

        stages = ", ".join(s.id for s in self.stages)
        raise UserError(f"plan '{self.name}' has no stage '{stage_id}' (stages: {stages})")

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(s.id for s in self.stages)


@dataclass(frozen=True)
class Finding:
    """One problem `plan check` finds in a plan file: `FILE:LINE: stage 'ID': message` (no line: about a node)."""

    file: str
    line: int | None
    message: str
    stage: str | None = None
    severity: str = "error"            # or "warning": said, but the plan is still ok

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: " + (f"stage '{self.stage}': " if self.stage else "") + self.message

    def to_json(self) -> dict:
        return {"file": self.file, "line": self.line, "severity": self.severity, "message": self.message,
                **({"stage": self.stage} if self.stage else {})}


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

"""The records a pipeline plan is made of: the `Plan`, its `Stage`s with their checks, uploads and smoke
variant, and the `Finding`s of `plan check`.

A `Plan` is parsed from TOML (ops.plan.parse) and never changes; what a run of it looks like on the nodes
is in ops.run.views. Nothing here touches a host.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from ops.errors import UserError


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
    nodes: tuple[str, ...] = ()        # several nodes: the command runs under torchrun on each (ops.run.ranks)
    nproc_per_node: str = "1"          # torchrun --nproc-per-node on each of `nodes`: a number, gpu, cpu or auto
    rdzv_host: str | None = None       # the address of nodes[0] the others reach (default: ops.run.ranks)
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
    port: str | None = None            # a server's TCP port on its node ("8123", "${port}"; ops.run.ports)
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









"""The plan file's schema, declared once: what each table and key takes, in pydantic (ops.declared).

`nodedeck plan schema` prints it as JSON Schema. Rules that a type cannot say are validators next to the
key they are about; `${var}` references are checked against `known` in the validation context (the plan's
[vars] and BUILTIN_VARS). What the keys do is in each Field's description; the run-time meaning of a plan
is in ops.plan.records, ops.plan.shelltext (how `${x}` goes into a command) and ops.run.checks.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, Union

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from ops.declared import Table, Text, brief, broken, listed, must
from ops.plan.records import JSON_OPS, VAR_RE, tcp_port
from ops.plan.shelltext import argv_template, quoted_refs, raw_refs

BUILTIN_VARS = ("root", "node.root", "node.name", "plan.name", "stage.id", "run_dir", "session", "log")
"""Variables every plan may use besides its own [vars]; values come at resolve time."""

STAGE_ID = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
NPROC_WORDS = ("gpu", "cpu", "auto")
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(v: Any) -> float | None:
    """Seconds from a number or a string like "90s", "30m", "2h", "1.5d"; None if invalid."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v) if v > 0 else None
    if isinstance(v, str):
        m = _DURATION_RE.match(v)
        if m and float(m.group(1)) > 0:
            return float(m.group(1)) * _UNITS[m.group(2)]
    return None


# -- what a value may say ----------------------------------------------------------------------
def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _texts(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _texts(v)]
    return []


def _unknown(value: Any, info: ValidationInfo) -> list[str]:
    known = (info.context or {}).get("known")
    if known is None:
        return []
    names = [m.group(1) for t in _texts(value) for m in VAR_RE.finditer(t.replace("$${", "\0"))]
    return [f"unknown variable ${{{n}}} (define it in [vars]; write $${{...}} for a literal)"
            for n in dict.fromkeys(names) if n not in known]


def _vars(value: Any, info: ValidationInfo) -> Any:
    """Every `${name}` in value names a variable the plan has."""
    found = _unknown(value, info)
    if found:
        raise broken("at", *found)
    return value


def _shell(value: str | list[str], info: ValidationInfo) -> str:
    """A command: a shell line (no `${x}` inside its quotes), or an argv array (no `:raw`) as a shell line."""
    found = _unknown(value, info)
    if isinstance(value, str):
        found += [f"${{{n}}} inside quotes (a value goes into a command as one shell-quoted word: write it outside "
                  f"the quotes, or ${{{n}:raw}} for its text as is)" for n in dict.fromkeys(quoted_refs(value))]
    else:
        found += [f"${{{n}:raw}} in an argv array (each item is one argument: write the command as a string to "
                  f"insert shell text)" for a in value for n in raw_refs(a)]
    if found:
        raise broken("at", *found)
    return value if isinstance(value, str) else argv_template(value)


def _duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds is None:
        raise ValueError("not a duration")
    return seconds


def _upload(value: Any) -> Any:
    if isinstance(value, str) and ":" in value:
        src, _, dest = value.partition(":")
        return {"src": src, "dest": dest}
    return value


def _not_reserved(name: str) -> str:
    if name in ("root", "node", "plan", "stage"):
        raise ValueError("reserved")
    return name


def _nproc(value: int | str) -> str:
    if isinstance(value, int) and value < 1 or isinstance(value, str) and value not in NPROC_WORDS and not (
            value.isascii() and value.isdigit() and int(value) >= 1):
        raise ValueError("not a process count")
    return str(value)


def _regex(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as e:
        raise broken("at", f"bad regex {brief(pattern)}: {e}") from None
    return pattern


def _port(value: int | str) -> str:
    if tcp_port(value) is None and not (isinstance(value, str) and VAR_RE.search(value)):
        raise ValueError("not a port")
    return str(value)


Templated = Annotated[Text, AfterValidator(_vars)]
Strings = Annotated[list[Annotated[str, Field(pattern=r"\S")]], BeforeValidator(listed),
                    must("an array of non-empty strings"), AfterValidator(_vars)]
Name = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$"), must("letters, digits, _")]
Positive = Annotated[Union[Annotated[int, Field(gt=0)], Annotated[float, Field(gt=0)]], must("a number > 0")]
Count = Annotated[int, Field(ge=0), must("a whole number >= 0")]
if TYPE_CHECKING:   # what validation makes of them (mypy knows no validators)
    Scalar: TypeAlias = str
    Shell: TypeAlias = str
    NProc: TypeAlias = str
    Port: TypeAlias = str
    Seconds: TypeAlias = float
else:   # what they take
    Scalar = Annotated[Union[str, int, float], must("a string or number"), AfterValidator(str),
                       AfterValidator(_vars)]
    Shell = Annotated[Union[Text, Annotated[list[str], Field(min_length=1)]],
                      must("a non-empty string, or an array of strings (an argv, each item one argument)"),
                      AfterValidator(_shell)]
    Seconds = Annotated[Union[int, float, str], AfterValidator(_duration),
                        must('seconds > 0 or a duration like "90s", "30m", "2h"')]
    NProc = Annotated[Union[int, str], AfterValidator(_nproc),
                      must("a whole number >= 1 or one of " + ", ".join(NPROC_WORDS))]
    Port = Annotated[Union[int, str], AfterValidator(_port),
                     must('a TCP port (1 to 65535) or a variable such as "${port}"'), AfterValidator(_vars)]
Env = dict[Name, Scalar]


# -- verify checks (paths relative to the stage's cwd) ------------------------------------------
class FileExists(Table):
    """A file exists; with fresh, this run wrote it."""

    kind: Literal["file_exists"]
    path: Templated
    fresh: bool = False


class MinBytes(Table):
    kind: Literal["min_bytes"]
    path: Templated
    min: Count
    fresh: bool = False


class MinLines(Table):
    """JSONL records or lines."""

    kind: Literal["min_lines"]
    path: Templated
    min: Count
    fresh: bool = False


class GlobCount(Table):
    kind: Literal["glob_count"]
    pattern: Templated
    min: Count = 1


class LogContains(Table):
    kind: Literal["log_contains"]
    pattern: Annotated[Templated, AfterValidator(_regex)] = Field(description="a regular expression")
    path: Templated | None = Field(None, description="default: this run's part of the stage log")


class LogAdvancing(Table):
    kind: Literal["log_advancing"]
    within: Positive = Field(120.0, description="seconds")
    path: Templated | None = None


class ProcessAlive(Table):
    kind: Literal["process_alive"]
    session: Templated | None = Field(None, description="a tmux session; default: the stage's own run")


class HttpOk(Table):
    """HTTP 200, fetched on the node."""

    kind: Literal["http_ok"]
    url: Annotated[str, Field(pattern=r"^https?://"), must("a URL starting with http:// or https://"),
                   AfterValidator(_vars)]
    timeout: Positive = 5.0


class JsonField(Table):
    """A JSON field of a JSONL file's line (a whole JSON file is read as one document) compared to a value."""

    kind: Literal["json_field"]
    path: Templated
    field: Templated = Field(description="dotted, list indexes allowed")
    op: Annotated[Literal[JSON_OPS], must("one of " + " ".join(JSON_OPS))]   # type: ignore[valid-type]
    value: Annotated[Union[int, float, str, bool], must("a number, string or boolean"), AfterValidator(_vars)]
    line: Annotated[Union[Literal["last", "first"], int], must('"last", "first" or a line number')] = "last"

    @field_validator("value")
    @classmethod
    def _number_for_order(cls, value: Any, info: ValidationInfo) -> Any:
        op = info.data.get("op", "==")
        if op not in ("==", "!=") and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise broken("at", f"op {op} needs a number value, got {brief(value)}")
        return value


class CommandOk(Table):
    """bash -c on the node exits 0."""

    kind: Literal["command_ok"]
    command: Annotated[Text, AfterValidator(_shell)]
    timeout: Positive = 60.0


Check = Annotated[Union[FileExists, MinBytes, MinLines, GlobCount, LogContains, LogAdvancing, ProcessAlive, HttpOk,
                        JsonField, CommandOk], Field(discriminator="kind")]


# -- a stage --------------------------------------------------------------------------------------
class Upload(Table):
    src: Templated = Field(description="a local path, relative to the plan file")
    dest: Templated = Field(description="on the node, relative to the stage's cwd; parent dirs created")


class Smoke(Table):
    """The small variant of a stage that must verify before the full run: its own command, or the stage's command
    plus args; verify and outputs default to the stage's."""

    command: Shell | None = None
    args: Shell | None = None
    verify: list[Check] | None = None
    outputs: Strings | None = None
    timeout: Seconds | None = None

    @field_validator("args")
    @classmethod
    def _one_way(cls, args: Any, info: ValidationInfo) -> Any:
        if info.data.get("command") is not None:
            raise broken("say", "smoke: give either command or args, not both")
        return args

    @model_validator(mode="after")
    def _has_a_command(self) -> Smoke:
        if self.command is None and self.args is None:
            raise broken("say", "smoke needs command or args")
        return self


class Stage(Table):
    """A [[stage]]: one command run in tmux on a node, and the checks that say it did its part."""

    id: Annotated[str, Field(pattern=STAGE_ID),
                  must("a string of letters, digits, _ . - (at most 64)")] = Field(description="unique in the plan")
    title: Text | None = Field(None, description="the todo text, shown whole (default: the id)")
    priority: Annotated[Literal["high", "medium", "low"], must("one of high, medium, low")] = "medium"
    kind: Annotated[Literal["job", "server"], must('"job" or "server"')] = Field(
        "job", description="job: runs to an exit; server: completed while its checks pass")
    depends_on: Strings = []
    node: Templated | None = Field(None, description="default: the plan's node")
    nodes: Annotated[list[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]],
                     must("an array of node names (as in nodes.toml)")] | None = Field(
        None, description="instead of node: one job on several nodes, run under torchrun on each (ops.run.ranks)")
    nproc_per_node: NProc = Field("1", description="with nodes: torchrun's --nproc-per-node")
    rdzv_host: Templated | None = Field(None, description="with nodes: the first node's address the others reach")
    port: Port | None = Field(None, description="a server's TCP port: free before launch, its http checks answered "
                                                "by it")
    cwd: Templated | None = Field(None, description="relative to ${root}; created on the node")
    command: Shell = Field(description="a bash command line, or an argv array; in commands ${x} goes in "
                                       "shell-quoted, ${x:raw} as it is (ops.plan.shelltext)")
    upload: Annotated[list[Annotated[Upload, BeforeValidator(_upload), must('"src:dest" or {src = ..., dest = ...}')]],
                      BeforeValidator(listed)] = []
    outputs: Strings = Field([], description="each must exist, written by this run (file_exists, fresh)")
    log: Templated | None = Field(None, description="default: <run_dir>/<session>.log")
    timeout: Seconds | None = Field(None, description="seconds, or 90s, 30m, 2h, 1d: then the run is stopped and "
                                                      "failed (a server: its time to become healthy)")
    retries: Annotated[int, Field(ge=0), must("an integer >= 0")] = Field(
        0, description="relaunches after a failure (not after a user stop)")
    env: Env = Field({}, description="on top of [plan] env; tmux panes get the tmux server's")
    setup: Annotated[str, must("a string (a shell line run before the command)")] | None = None
    verify: list[Check] = []
    smoke: Smoke | None = None
    smoke_args: Shell | None = Field(None, description="the smoke variant: the command plus these args")
    todo: Strings = Field([], description="coding-agent todo items this stage backs: a glob (* ?) matched "
                                          "case-insensitively against the item text, or a plain substring")

    @field_validator("nodes")
    @classmethod
    def _one_job_on_several(cls, nodes: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if nodes is None:
            return nodes
        rules = ["give node or nodes, not both"] if info.data.get("node") is not None else []
        if info.data.get("kind") == "server":
            rules.append("nodes is for jobs (torchrun on each node); a server runs on one node")
        if len(nodes) < 2 or len(set(nodes)) != len(nodes):
            rules.append(f"nodes must name two or more different nodes (use node = ... for one), got {brief(nodes)}")
        if rules:
            raise broken("say", *rules)
        return nodes

    @field_validator("nproc_per_node", "rdzv_host")
    @classmethod
    def _with_nodes(cls, value: Any, info: ValidationInfo) -> Any:
        if "nodes" in info.data and info.data["nodes"] is None:
            raise broken("is", "is for a stage with nodes = [...] (one job on several nodes)")
        return value

    @field_validator("port")
    @classmethod
    def _server_port(cls, port: Any, info: ValidationInfo) -> Any:
        if info.data.get("kind", "server") != "server":
            raise broken("say", "port is for a server stage (the TCP port it listens on)")
        return port

    @field_validator("smoke_args")
    @classmethod
    def _one_smoke(cls, args: Any, info: ValidationInfo) -> Any:
        if info.data.get("smoke") is not None:
            raise broken("say", "give either smoke_args or smoke, not both")
        return args


def _some_stages(stages: list[Stage]) -> list[Stage]:
    if not stages:
        raise broken("say", "plan has no stages (add [[stage]] tables)")
    return stages


class PlanHead(Table):
    name: Text | None = Field(None, description="names the tmux sessions and state rows (default: the file name)")
    description: Annotated[str, must("a string")] = ""
    node: Text | None = Field(None, description="the stages' default node (`--node` replaces it; default local)")
    root: Text | None = Field(None, description="${root}; default: the node's root")
    max_parallel: Annotated[int, Field(ge=1), must("an integer >= 1")] | None = Field(
        None, description="stages at once per node (default: the node's max_parallel)")
    env: Env = Field({}, description="every stage's environment (tmux panes get the tmux server's)")
    setup: Text | None = Field(None, description="a shell line run before every stage's command")


class PlanFile(Table):
    """A plan: [plan], [vars] (`${name}` anywhere in a stage; `--var name=value` overrides) and [[stage]]s."""

    plan: PlanHead = PlanHead.model_construct()
    vars: dict[Annotated[Name, AfterValidator(_not_reserved), must(
        "letters, digits, _; not root, node, plan or stage")], Scalar] = {}
    stage: Annotated[list[Stage], AfterValidator(_some_stages)] = Field([], validate_default=True)

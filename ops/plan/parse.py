"""Parse and validate a plan TOML file into a `Plan`; every problem is one line.

Errors read `FILE:LINE: stage 'ID': message` (the line found through
ops.plan.locate, since tomllib only has positions for syntax errors).
`load_plan` raises `PlanError` (a UserError) carrying every problem found;
its message is the first one.

The schema:

    [plan]
    name = "eagle3-sglang"        # default: the file name; names the tmux sessions and state rows
    description = "..."
    node = "gpu1"                 # default node of the stages (`--node` replaces it; default local)
    root = "${node.root}/x"       # `${root}`; default: the node's root
    max_parallel = 8              # stages at once per node; default: the node's max_parallel
    env = { HF_HOME = "/data/hf" }   # every stage's environment (tmux panes get the tmux server's)
    setup = "source /opt/venv/bin/activate"   # shell line run before every stage's command

    [vars]                        # `${name}` anywhere in a stage; `--var name=value` overrides
    target = "/models/llama"

    [[stage]]
    id = "prep_sharegpt"          # letters, digits, _ . - (at most 64); unique
    title = "..."                 # the todo text, shown whole (default: the id)
    priority = "high"             # high | medium (default) | low
    kind = "job"                  # job (runs to an exit) | server (completed while its checks pass)
    port = "${port}"              # a server's TCP port: free before launch, its http checks answered by it
    depends_on = ["a", "b"]
    node = "gpu1"
    nodes = ["gpu1", "gpu2"]      # instead of node: one job on several nodes, run under torchrun on
                                  # each (--nnodes, --node-rank, the first node's address and a free
                                  # port there); the command is what each worker runs (ops.plan.ranks)
    nproc_per_node = "gpu"        # with nodes: torchrun's --nproc-per-node (a number, gpu, cpu, auto; default 1)
    rdzv_host = "10.0.0.1"        # with nodes: the first node's address the others reach
    cwd = "data"                  # relative to ${root}; created on the node
    command = "..."               # bash command line, or an argv array (each item one argument)
                                  # in commands ${x} goes in shell-quoted, ${x:raw} as it is
                                  # (the rule: ops.plan.shelltext)
    env = { CUDA_VISIBLE_DEVICES = "0" }   # on top of [plan] env; tmux panes get the tmux server's
    setup = "source /opt/venv/bin/activate"   # shell line run before the command (after [plan] setup)
    upload = ["local.txt:inputs/local.txt", { src = "a", dest = "b" }]   # local paths relative
                                  # to the plan file, remote ones to cwd; parent dirs created
    outputs = ["out.jsonl"]       # each must exist, written by this run (file_exists, fresh)
    log = "logs/x.log"            # default: <run_dir>/<session>.log
    timeout = "2h"                # seconds or 90s/30m/2h/1d; a server: time to become healthy
    retries = 1                   # relaunches after a failure (not after a user stop)
    smoke_args = "--max-samples 50"               # smoke variant: the command plus these args, or
    smoke = { command = "...", args = "...", verify = [...], outputs = [...], timeout = "5m" }
                                  # (command or args; verify and outputs default to the stage's)
    verify = [{ kind = "min_lines", path = "out.jsonl", min = 1000 }, ...]   # or [[stage.verify]]
    todo = ["train*drafter", "eagle"]             # coding-agent todo items this stage backs: a glob
                                  # (* ?) matched case-insensitively against the item text, or a
                                  # plain substring (see ops.agents.links)

Check kinds and their arguments (paths relative to the stage's cwd): file_exists path [fresh];
min_bytes path min [fresh]; min_lines path min [fresh]; glob_count pattern [min=1];
log_contains pattern (regex) [path, default: this run's part of the stage log]; log_advancing
[within=120 s] [path]; process_alive [session, default: the stage's own]; http_ok url [timeout=5]
(fetched on the node); json_field path field (dotted, list indexes allowed) op (< <= > >= == !=)
value [line = "last" | "first" | N; a whole JSON file is read as one document]; command_ok
command [timeout=60].
"""

from __future__ import annotations

import enum
import re
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from ops.errors import UserError
from ops.inputfile import MAX_DEPTH, deep_line, read_input, toml_value_error, too_deep
from ops.plan.locate import SourceMap
from ops.plan.model import (
    CHECK_KINDS,
    JSON_OPS,
    VAR_RE,
    CheckSpec,
    Plan,
    Priority,
    Smoke,
    Stage,
    StageKind,
    Upload,
    tcp_port,
)
from ops.plan.order import find_cycle
from ops.plan.shelltext import argv_template, quoted_refs, raw_refs

E = TypeVar("E", bound=enum.Enum)

PLAN_KEYS = {"name", "description", "node", "root", "max_parallel", "env", "setup"}
TOP_KEYS = {"plan", "vars", "stage"}
STAGE_KEYS = {
    "id", "title", "priority", "depends_on", "node", "cwd", "command", "upload", "outputs",
    "timeout", "retries", "log", "env", "setup", "smoke", "smoke_args", "kind", "verify", "todo",
    "nodes", "nproc_per_node", "rdzv_host", "port",
}
SMOKE_KEYS = {"command", "args", "verify", "timeout", "outputs"}

# kind -> {arg: (types, required, default)}
_STR, _NUM, _INT = (str,), (int, float), (int,)
CHECK_ARGS: dict[str, dict[str, tuple[tuple[type, ...], bool, Any]]] = {
    "file_exists": {"path": (_STR, True, None), "fresh": ((bool,), False, False)},
    "min_bytes": {"path": (_STR, True, None), "min": (_INT, True, None), "fresh": ((bool,), False, False)},
    "min_lines": {"path": (_STR, True, None), "min": (_INT, True, None), "fresh": ((bool,), False, False)},
    "glob_count": {"pattern": (_STR, True, None), "min": (_INT, False, 1)},
    "log_contains": {"pattern": (_STR, True, None), "path": (_STR, False, None)},
    "log_advancing": {"within": (_NUM, False, 120.0), "path": (_STR, False, None)},
    "process_alive": {"session": (_STR, False, None)},
    "http_ok": {"url": (_STR, True, None), "timeout": (_NUM, False, 5.0)},
    "json_field": {
        "path": (_STR, True, None), "field": (_STR, True, None), "op": (_STR, True, None),
        "value": ((int, float, str, bool), True, None), "line": ((str, int), False, "last"),
    },
    "command_ok": {"command": (_STR, True, None), "timeout": (_NUM, False, 60.0)},
}
assert set(CHECK_ARGS) == set(CHECK_KINDS)

BUILTIN_VARS = ("root", "node.root", "node.name", "plan.name", "stage.id", "run_dir", "session", "log")
"""Variables every plan may use besides its own [vars]; values come at resolve time."""

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")   # as nodes.toml's names
NPROC_WORDS = ("gpu", "cpu", "auto")
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class PlanError(UserError):
    """A plan file that cannot be used; `errors` holds every problem, one line each."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__(errors[0])


def load_plan(path: str | Path) -> Plan:
    """Read, parse and validate a plan file; raise PlanError listing every problem."""
    p = Path(path)
    try:
        raw = read_input(p, "plan")
    except UserError as e:
        raise PlanError([str(e)]) from None
    return parse_plan(raw, str(p))


def parse_plan(raw: bytes | str, filename: str = "<plan>") -> Plan:
    return _Parser(raw, filename).parse()


def _show(v: Any) -> str:
    """A value for a one-line message: repr, single line, at most 40 characters."""
    if too_deep(v, 4):
        return f"({_type_name(v)} nested deeper than 4 levels)"
    s = repr(v).replace("\n", "\\n").replace("\r", "\\r")
    return s if len(s) <= 40 else s[:37] + "..."


def _types_name(types: tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}
    if set(types) == {int, float}:
        return "a number"
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def _type_name(v: Any) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "an array",
            dict: "a table"}.get(type(v), type(v).__name__)


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


class _Parser:
    def __init__(self, raw: bytes | str, filename: str):
        self.raw = raw
        self.file = filename
        self.errors: list[str] = []
        self._map: SourceMap | None = None
        self.index: dict[str, int] = {}   # stage id -> position of its [[stage]] table

    @property
    def map(self) -> SourceMap:
        """Where each key and table is in the text (made by parse() before any table is read)."""
        if self._map is None:
            raise RuntimeError("the plan's source map is read before parse() made it")
        return self._map

    # -- error helpers -------------------------------------------------------
    def err(self, line: int, message: str, stage: str | None = None) -> None:
        where = f"stage '{stage}': " if stage else ""
        self.errors.append(f"{self.file}:{line}: {where}{message}".replace("\n", " "))

    def parse(self) -> Plan:
        text = self._decode()
        if text is None:
            raise PlanError(self.errors)
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise PlanError([self._toml_error(str(e), text)]) from None
        except ValueError as e:
            raise PlanError([toml_value_error(text, self.file, e)]) from None
        except RecursionError:
            data = None
        if data is None or too_deep(data):
            raise PlanError([f"{self.file}:{deep_line(text)}: arrays or tables nested deeper than {MAX_DEPTH} levels"])
        self._map = SourceMap(text)
        plan = self._plan(data)
        if self.errors:
            raise PlanError(self.errors)
        return plan

    def _decode(self) -> str | None:
        if isinstance(self.raw, str):
            return self.raw
        try:
            return self.raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = self.raw.count(b"\n", 0, e.start) + 1
            self.err(line, f"not UTF-8 text (byte 0x{self.raw[e.start]:02x} at offset {e.start})")
            return None

    def _toml_error(self, msg: str, text: str) -> str:
        msg = msg.replace("\n", " ")
        m = re.search(r"\s*\(at line (\d+), column (\d+)\)\s*$", msg)
        if m:
            return f"{self.file}:{m.group(1)}: invalid TOML: {msg[:m.start()]} (column {m.group(2)})"
        m = re.search(r"\s*\(at end of document\)\s*$", msg)
        if m:
            last = max(1, text.count("\n") + (0 if text.endswith("\n") or not text else 1))
            return f"{self.file}:{last}: invalid TOML: {msg[:m.start()]} (at end of file)"
        return f"{self.file}:1: invalid TOML: {msg}"

    # -- plan level -----------------------------------------------------------
    def _plan(self, data: dict) -> Plan:
        sm = self.map
        for key in data:
            if key not in TOP_KEYS:
                self.err(sm.plan_key("", key) if key in sm.top.get("", {}) else sm.top_headers.get(key, 1),
                         f"unknown top-level key {_show(key)} (expected one of: plan, vars, stage)")
        head = data.get("plan", {})
        if not isinstance(head, dict):
            self.err(sm.plan_key("", "plan"), f"[plan] must be a table, got {_type_name(head)}")
            head = {}
        for key in head:
            if key not in PLAN_KEYS:
                self.err(sm.plan_key("plan", key),
                         f"[plan]: unknown key {_show(key)} (expected one of: {', '.join(sorted(PLAN_KEYS))})")
        name = self._plan_str(head, "name", default=Path(self.file).stem or "plan")
        description = self._plan_str(head, "description", default="")
        node = self._plan_str(head, "node", default=None)
        root = self._plan_str(head, "root", default=None)
        max_parallel = head.get("max_parallel")
        if max_parallel is not None and (type(max_parallel) is not int or max_parallel < 1):
            self.err(sm.plan_key("plan", "max_parallel"),
                     f"[plan]: max_parallel must be an integer >= 1, got {_show(max_parallel)}")
            max_parallel = None

        vars_ = data.get("vars", {})
        if not isinstance(vars_, dict):
            self.err(sm.plan_key("", "vars"), f"[vars] must be a table, got {_type_name(vars_)}")
            vars_ = {}
        clean_vars: dict[str, str] = {}
        for k, v in vars_.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) or k in ("root", "node", "plan", "stage"):
                self.err(sm.plan_key("vars", k),
                         f"[vars]: bad variable name {_show(k)} (letters, digits, _; not root/node/plan/stage)")
            elif isinstance(v, bool) or not isinstance(v, (str, int, float)):
                self.err(sm.plan_key("vars", k), f"[vars]: {k} must be a string or number, got {_type_name(v)}")
            else:
                clean_vars[k] = str(v)
        known = set(BUILTIN_VARS) | set(clean_vars)
        for k, v in clean_vars.items():
            self._check_vars(v, known, sm.plan_key("vars", k), None, f"[vars] {k}")
        self._var_cycles(clean_vars)

        raw_stages = data.get("stage", [])
        if not isinstance(raw_stages, list):
            self.err(sm.plan_key("", "stage"), "`stage` must be an array of tables ([[stage]])")
            raw_stages = []
        if not raw_stages:
            self.err(1, "plan has no stages (add [[stage]] tables)")
        stages: list[Stage] = []
        seen: dict[str, int] = {}
        for i, st in enumerate(raw_stages):
            stage = self._stage(i, st, known)
            if stage is None:
                continue
            line = stage.line or 1   # the parser sets every stage's line
            if stage.id in seen:
                self.err(line, f"duplicate stage id (first defined at line {seen[stage.id]})", stage.id)
                continue
            seen[stage.id] = line
            self.index[stage.id] = i
            stages.append(stage)
        self._deps(stages)
        plan_env = self._env_table(head.get("env", {}), sm.plan_key("plan", "env"), known)
        setup = self._plan_str(head, "setup", default=None)
        return Plan(name=name, stages=tuple(stages), description=description, node=node, root=root,
                    vars=clean_vars, max_parallel=max_parallel, path=self.file, env=plan_env, setup=setup)

    def _env_table(self, env: Any, line: int, known: set[str]) -> dict[str, str]:
        """[plan] env: a table of variable name -> string (set in every stage's environment)."""
        if not isinstance(env, dict):
            self.err(line, f"[plan]: env must be a table of strings, got {_type_name(env)}")
            return {}
        clean = {}
        for k, v in env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                self.err(line, f"[plan]: env: bad variable name {_show(k)}")
            elif isinstance(v, bool) or not isinstance(v, (str, int, float)):
                self.err(line, f"[plan]: env.{k} must be a string or number, got {_type_name(v)}")
            else:
                clean[k] = str(v)
                self._check_vars(str(v), known, line, None, f"[plan] env.{k}")
        return clean

    def _plan_str(self, head: dict, key: str, default):
        v = head.get(key, default)
        if v is not default and not (isinstance(v, str) and (v.strip() or key == "description")):
            self.err(self.map.plan_key("plan", key), f"[plan]: {key} must be a non-empty string, got {_show(v)}")
            return default
        return v

    def _check_vars(self, text: str, known: set[str], line: int, stage: str | None, what: str) -> None:
        for m in VAR_RE.finditer(text.replace("$${", "\0")):
            if m.group(1) not in known:
                self.err(line,
                         f"{what}: unknown variable ${{{m.group(1)}}} (define it in [vars]; write $${{...}} for a "
                         f"literal)", stage)

    def _check_shell(self, text: str, line: int, stage: str | None, what: str) -> None:
        """A command string: no `${x}` inside quotes (its value is inserted as one quoted word)."""
        for name in dict.fromkeys(quoted_refs(text)):
            self.err(line, f"{what}: ${{{name}}} inside quotes (a value goes into a command as one shell-quoted "
                           f"word: write it outside the quotes, or ${{{name}:raw}} for its text as is)", stage)

    def _var_cycles(self, vars_: dict[str, str]) -> None:
        for start in vars_:
            path = [start]
            stack = [(start, iter(VAR_RE.findall(vars_[start])))]
            while stack:
                name, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    stack.pop()
                    path.pop()
                    continue
                if nxt == start:
                    self.err(self.map.plan_key("vars", start), f"[vars]: variable cycle {' -> '.join(path + [nxt])}")
                    return
                if nxt in vars_ and nxt not in path:
                    path.append(nxt)
                    stack.append((nxt, iter(VAR_RE.findall(vars_[nxt]))))

    # -- stages ---------------------------------------------------------------
    def _stage(self, i: int, st: Any, known: set[str]) -> Stage | None:
        sm = self.map
        header = sm.stage_line(i)
        if not isinstance(st, dict):
            self.err(header, f"stage #{i + 1} must be a table, got {_type_name(st)}")
            return None
        sid = st.get("id")
        if not isinstance(sid, str) or not _ID_RE.match(sid):
            self.err(sm.stage_key(i, "id"),
                     f"stage #{i + 1}: id must be a string of letters, digits, _ . - (at most 64), got {_show(sid)}")
            return None
        n_errors = len(self.errors)

        def err(key: str, msg: str, sub: str = "") -> None:
            self.err(sm.stage_key(i, key, sub), msg, sid)

        for key in st:
            if key not in STAGE_KEYS:
                err(key, f"unknown key {_show(key)} (expected one of: {', '.join(sorted(STAGE_KEYS))})")
        known = known | {"stage.id"}

        def string(key: str, required: bool = False, default=None, sub: str = "", src: dict = st):
            v = src.get(key)
            if v is None:
                if required:
                    err(key, f"{key} is required", sub)
                return default
            if not isinstance(v, str) or not v.strip():
                err(key, f"{key} must be a non-empty string, got {_show(v)}", sub)
                return default
            self._check_vars(v, known, sm.stage_key(i, key, sub), sid, key)
            return v

        def command_of(key: str, sub: str = "", src: dict = st, required=True):
            v = src.get(key)
            if isinstance(v, list):
                return argv_of(key, v, sub)
            v = string(key, required=required, sub=sub, src=src)
            if v is not None:
                self._check_shell(v, sm.stage_key(i, key, sub), sid, key)
            return v

        def argv_of(key: str, v: list, sub: str = "") -> str | None:
            """An argv array as a command string whose every item stays one argument."""
            if not v or not all(isinstance(a, str) for a in v):
                err(key, f"{key} as an array must be non-empty strings (an argv), got {_show(v)}", sub)
                return None
            for a in v:
                self._check_vars(a, known, sm.stage_key(i, key, sub), sid, key)
                for name in raw_refs(a):
                    err(key, f"{key}: ${{{name}:raw}} in an argv array (each item is one argument: "
                             f"write the command as a string to insert shell text)", sub)
            return argv_template(v)

        def str_list(key: str, sub: str = "", src: dict = st) -> tuple[str, ...]:
            v = src.get(key, [])
            if isinstance(v, str):
                v = [v]
            if not isinstance(v, list) or not all(isinstance(a, str) and a.strip() for a in v):
                err(key, f"{key} must be an array of non-empty strings, got {_show(v)}", sub)
                return ()
            for a in v:
                self._check_vars(a, known, sm.stage_key(i, key, sub), sid, key)
            return tuple(v)

        def duration(key: str, sub: str = "", src: dict = st):
            v = src.get(key)
            if v is None:
                return None
            d = parse_duration(v)
            if d is None:
                err(key, f"{key} must be seconds > 0 or a duration like \"90s\", \"30m\", \"2h\", got {_show(v)}", sub)
            return d

        title = st.get("title", sid)
        if not isinstance(title, str) or not title.strip():
            err("title", f"title must be a non-empty string, got {_show(title)}")
            title = sid
        command = command_of("command")

        def member(key: str, default: E, expected: str) -> E:
            """The value of `key` as a member of default's enum (default when absent or wrong, with an error)."""
            v = st.get(key, default.value)
            if isinstance(v, str):
                try:
                    return type(default)(v)
                except ValueError:
                    pass
            err(key, f"{key} must be {expected}, got {_show(v)}")
            return default

        priority = member("priority", Priority.MEDIUM, "one of high, medium, low")
        kind = member("kind", StageKind.JOB, "\"job\" or \"server\"")

        depends_on = str_list("depends_on")
        port = st.get("port")
        if port is not None and kind is not StageKind.SERVER:
            err("port", "port is for a server stage (the TCP port it listens on)")
        elif port is not None and tcp_port(port) is None and not (isinstance(port, str) and VAR_RE.search(port)):
            err("port", f"port must be a TCP port (1 to 65535) or a variable such as \"${{port}}\", got {_show(port)}")
        elif isinstance(port, str):
            string("port")
        node = string("node")
        nodes, nproc, rdzv_host = self._nodes(st, node, kind, err, string)
        cwd = string("cwd")
        log = string("log")
        outputs = str_list("outputs")
        todo_patterns = str_list("todo")
        timeout = duration("timeout")

        retries = st.get("retries", 0)
        if type(retries) is not int or retries < 0:
            err("retries", f"retries must be an integer >= 0, got {_show(retries)}")
            retries = 0

        env = st.get("env", {})
        if not isinstance(env, dict):
            err("env", f"env must be a table of strings, got {_type_name(env)}")
            env = {}
        clean_env = {}
        for k, v in env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                self.err(sm.stage_key(i, k, "env"), f"env: bad variable name {_show(k)}", sid)
            elif isinstance(v, bool) or not isinstance(v, (str, int, float)):
                self.err(sm.stage_key(i, k, "env"), f"env.{k} must be a string or number, got {_type_name(v)}", sid)
            else:
                clean_env[k] = str(v)
                self._check_vars(str(v), known, sm.stage_key(i, k, "env"), sid, f"env.{k}")

        setup = st.get("setup")
        if setup is not None and not isinstance(setup, str):
            err("setup", f"setup must be a string (a shell line run before the command), got {_type_name(setup)}")
            setup = None

        uploads = self._uploads(i, sid, st.get("upload", []), known)
        verify = self._checks(i, sid, st.get("verify", []), "", known)
        smoke = self._smoke(i, sid, st, command, verify, outputs, known, command_of, argv_of, str_list, duration)

        if len(self.errors) > n_errors or command is None:
            return None
        return Stage(id=sid, title=title, command=command, priority=priority, depends_on=depends_on, node=node,
                     nodes=nodes, nproc_per_node=nproc, rdzv_host=rdzv_host, cwd=cwd, upload=uploads,
                     outputs=outputs, timeout=timeout, retries=retries, log=log,
                     env=clean_env, setup=setup, smoke=smoke, kind=kind, verify=verify, todo=todo_patterns,
                     port=str(port) if port is not None and kind is StageKind.SERVER else None,
                     line=sm.stage_line(i))

    def _nodes(self, st: dict, node: str | None, kind: StageKind, err,
               string) -> tuple[tuple[str, ...], str, str | None]:
        """(nodes, nproc_per_node, rdzv_host) of a stage: several nodes for one torchrun job, or none."""
        v = st.get("nodes")
        rdzv_host = string("rdzv_host")
        nproc = st.get("nproc_per_node", 1)
        if v is None:
            for key in ("nproc_per_node", "rdzv_host"):
                if key in st:
                    err(key, f"{key} is for a stage with nodes = [...] (one job on several nodes)")
            return (), "1", None
        if node is not None:
            err("nodes", "give node or nodes, not both")
        if kind is StageKind.SERVER:
            err("nodes", "nodes is for jobs (torchrun on each node); a server runs on one node")
        if not isinstance(v, list) or not all(isinstance(n, str) and _NODE_RE.match(n) for n in v):
            err("nodes", f"nodes must be an array of node names (as in nodes.toml), got {_show(v)}")
            return (), "1", None
        if len(v) < 2 or len(set(v)) != len(v):
            err("nodes", f"nodes must name two or more different nodes (use node = ... for one), got {_show(v)}")
        if isinstance(nproc, bool) or not (isinstance(nproc, int) and nproc >= 1 or nproc in NPROC_WORDS
                                           or isinstance(nproc, str) and nproc.isdigit() and int(nproc) >= 1):
            err("nproc_per_node", f"nproc_per_node must be a whole number >= 1 or one of {', '.join(NPROC_WORDS)}, "
                                  f"got {_show(nproc)}")
            nproc = 1
        return tuple(v), str(nproc), rdzv_host

    def _uploads(self, i: int, sid: str, v: Any, known: set[str]) -> tuple[Upload, ...]:
        line = self.map.stage_key(i, "upload")
        if not isinstance(v, list):
            v = [v]
        out = []
        for n, item in enumerate(v):
            if isinstance(item, str) and ":" in item:
                src, _, dest = item.partition(":")
            elif isinstance(item, dict) and set(item) == {"src", "dest"}:
                src, dest = item["src"], item["dest"]
            else:
                self.err(line, f"upload[{n}] must be \"src:dest\" or {{src = ..., dest = ...}}, got {_show(item)}", sid)
                continue
            if not (isinstance(src, str) and src.strip() and isinstance(dest, str) and dest.strip()):
                self.err(line, f"upload[{n}]: src and dest must be non-empty strings", sid)
                continue
            self._check_vars(src + dest, known, line, sid, f"upload[{n}]")
            out.append(Upload(src, dest))
        return tuple(out)

    def _checks(self, i: int, sid: str, v: Any, variant: str, known: set[str]) -> tuple[CheckSpec, ...]:
        where = "verify" if not variant else f"{variant}.verify"
        if not isinstance(v, list):
            self.err(self.map.stage_key(i, "verify", variant),
                     f"{where} must be an array of check tables, got {_type_name(v)}", sid)
            return ()
        out = []
        for n, c in enumerate(v):
            line = self.map.check_line(i, variant, n)
            if not isinstance(c, dict):
                self.err(line,
                         f"{where}[{n}] must be a table like {{kind = \"file_exists\", path = ...}}, "
                         f"got {_show(c)}", sid)
                continue
            kind = c.get("kind")
            if not isinstance(kind, str) or kind not in CHECK_ARGS:
                self.err(line, f"{where}[{n}]: unknown check kind {_show(kind)} (known: {', '.join(CHECK_KINDS)})", sid)
                continue
            schema = CHECK_ARGS[kind]
            args: dict[str, Any] = {}
            ok = True
            for key, val in c.items():
                if key == "kind":
                    continue
                if key not in schema:
                    self.err(line,
                             f"{where}[{n}] {kind}: unknown argument {_show(key)} (expected: {', '.join(schema)})", sid)
                    ok = False
                    continue
                types = schema[key][0]
                if not isinstance(val, types) or (isinstance(val, bool) and bool not in types):
                    self.err(line, f"{where}[{n}] {kind}: {key} must be {_types_name(types)}, got {_show(val)}", sid)
                    ok = False
                    continue
                if isinstance(val, str):
                    self._check_vars(val, known, line, sid, f"{where}[{n}] {kind}.{key}")
                    if kind == "command_ok" and key == "command":
                        self._check_shell(val, line, sid, f"{where}[{n}] {kind}.{key}")
                args[key] = val
            for key, (_types, required, default) in schema.items():
                if key not in args:
                    if required:
                        if key not in c:
                            self.err(line, f"{where}[{n}] {kind}: {key} is required", sid)
                        ok = False
                    elif default is not None:
                        args[key] = default
            if ok:
                ok = self._check_values(kind, args, line, sid, f"{where}[{n}] {kind}")
            if ok:
                out.append(CheckSpec(kind, args, line))
        return tuple(out)

    def _check_values(self, kind: str, args: dict, line: int, sid: str, what: str) -> bool:
        if "min" in args and args["min"] < 0:
            self.err(line, f"{what}: min must be >= 0, got {args['min']}", sid)
            return False
        for key in ("within", "timeout"):
            if key in args and not args[key] > 0:
                self.err(line, f"{what}: {key} must be > 0, got {args[key]}", sid)
                return False
        if kind == "log_contains":
            try:
                re.compile(args["pattern"])
            except re.error as e:
                self.err(line, f"{what}: bad regex {_show(args['pattern'])}: {e}", sid)
                return False
        if kind == "json_field":
            if args["op"] not in JSON_OPS:
                self.err(line, f"{what}: op must be one of {' '.join(JSON_OPS)}, got {_show(args['op'])}", sid)
                return False
            ln = args.get("line", "last")
            if isinstance(ln, str) and ln not in ("last", "first"):
                self.err(line, f"{what}: line must be \"last\", \"first\" or a line number, got {_show(ln)}", sid)
                return False
            value = args["value"]
            if args["op"] not in ("==", "!=") and (isinstance(value, bool) or not isinstance(value, (int, float))):
                self.err(line, f"{what}: op {args['op']} needs a number value, got {_show(args['value'])}", sid)
                return False
        if kind == "http_ok" and not re.match(r"^https?://", args["url"]):
            self.err(line, f"{what}: url must start with http:// or https://, got {_show(args['url'])}", sid)
            return False
        return True

    def _smoke(self, i, sid, st, command, verify, outputs, known, command_of, argv_of, str_list,
               duration) -> Smoke | None:
        smoke = st.get("smoke")
        smoke_args = st.get("smoke_args")
        if smoke is None and smoke_args is None:
            return None
        if smoke is not None and smoke_args is not None:
            self.err(self.map.stage_key(i, "smoke_args"), "give either smoke_args or smoke, not both", sid)
            return None
        if smoke_args is not None:
            if isinstance(smoke_args, list) and smoke_args and all(isinstance(a, str) for a in smoke_args):
                smoke_args = argv_of("smoke_args", smoke_args)
                if smoke_args is None:
                    return None
            elif not isinstance(smoke_args, str) or not smoke_args.strip():
                self.err(self.map.stage_key(i, "smoke_args"),
                         f"smoke_args must be a non-empty string, got {_show(smoke_args)}", sid)
                return None
            else:
                self._check_vars(smoke_args, known, self.map.stage_key(i, "smoke_args"), sid, "smoke_args")
                self._check_shell(smoke_args, self.map.stage_key(i, "smoke_args"), sid, "smoke_args")
            smoke = {"args": smoke_args}
        if not isinstance(smoke, dict):
            self.err(self.map.stage_key(i, "smoke"),
                     f"smoke must be a table like {{command = ..., verify = [...]}} or {{args = ...}}, got "
                     f"{_type_name(smoke)}", sid)
            return None
        for key in smoke:
            if key not in SMOKE_KEYS:
                self.err(self.map.stage_key(i, key, "smoke"),
                         f"smoke: unknown key {_show(key)} (expected one of: {', '.join(sorted(SMOKE_KEYS))})", sid)
        if "command" in smoke and "args" in smoke:
            self.err(self.map.stage_key(i, "args", "smoke"), "smoke: give either command or args, not both", sid)
            return None
        if "command" in smoke:
            cmd = command_of("command", sub="smoke", src=smoke)
        elif "args" in smoke:
            args = smoke["args"]
            if isinstance(args, list) and args and all(isinstance(a, str) for a in args):
                args = argv_of("args", args, "smoke")
                if args is None:
                    return None
            elif not isinstance(args, str) or not args.strip():
                self.err(self.map.stage_key(i, "args", "smoke"),
                         f"smoke.args must be a non-empty string, got {_show(args)}", sid)
                return None
            else:
                self._check_vars(args, known, self.map.stage_key(i, "args", "smoke"), sid, "smoke.args")
                self._check_shell(args, self.map.stage_key(i, "args", "smoke"), sid, "smoke.args")
            cmd = None if command is None else f"{command} {args}"
        else:
            self.err(self.map.stage_key(i, "smoke"), "smoke needs command or args", sid)
            return None
        sverify = self._checks(i, sid, smoke["verify"], "smoke", known) if "verify" in smoke else verify
        souts = str_list("outputs", sub="smoke", src=smoke) if "outputs" in smoke else outputs
        stimeout = duration("timeout", sub="smoke", src=smoke)
        if cmd is None:
            return None
        return Smoke(command=cmd, verify=_with_outputs(souts, sverify), timeout=stimeout)

    # -- dependencies ---------------------------------------------------------
    def _deps(self, stages: list[Stage]) -> None:
        ids = {s.id for s in stages}
        by_id = {s.id: s for s in stages}
        for s in stages:
            for d in s.depends_on:
                if d == s.id:
                    self.err(self._dep_line(s), "depends on itself", s.id)
                elif d not in ids:
                    self.err(self._dep_line(s),
                             f"unknown dependency {_show(d)} (stages: {', '.join(sorted(ids))})", s.id)
        cycle = find_cycle(stages)
        if cycle:
            self.err(self._dep_line(by_id[cycle[0]]), f"dependency cycle: {' -> '.join(cycle)}", cycle[0])

    def _dep_line(self, s: Stage) -> int:
        return self.map.stage_key(self.index[s.id], "depends_on")


def _with_outputs(outputs: tuple[str, ...], verify: tuple[CheckSpec, ...]) -> tuple[CheckSpec, ...]:
    """Each declared output becomes a `file_exists` check that the run itself wrote it."""
    return tuple(CheckSpec("file_exists", {"path": o, "fresh": True}) for o in outputs) + verify


def effective_verify(stage: Stage, smoke: bool) -> tuple[CheckSpec, ...]:
    """The checks a run must pass: outputs first, then verify (plus process_alive for servers)."""
    checks = stage.smoke.verify if smoke and stage.smoke else _with_outputs(stage.outputs, stage.verify)
    if stage.kind is StageKind.SERVER and not any(c.kind == "process_alive" and not c.args.get("session")
                                                  for c in checks):
        checks = (CheckSpec("process_alive", {}),) + checks
    return checks

"""Read a plan TOML file into a `Plan`, with every problem of the file at once, one line each.

The schema is declared in ops.plan.schema (`nodedeck plan schema` prints it as JSON Schema); this module reads
the file, validates it against the schema, checks what spans stages (ids, dependencies, variable cycles) and
builds the records (ops.plan.records). Each problem reads `FILE:LINE: stage 'ID': message`, the line found by
ops.plan.locate (tomllib has positions only for syntax errors), sorted by line. `load_plan` raises `PlanError`
(a UserError) carrying them all; `inspect_plan` gives them with the best plan that can be built beside them,
for `plan check` to lint what it can.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from ops.declared import Problem, brief, validate
from ops.errors import UserError
from ops.inputfile import MAX_DEPTH, deep_line, read_input, toml_value_error, too_deep
from ops.plan import schema
from ops.plan.locate import SourceMap
from ops.plan.order import find_cycle
from ops.plan.records import CHECK_KINDS, VAR_RE, CheckSpec, Finding, Plan, Priority, Smoke, Stage, StageKind, Upload
from ops.plan.schema import BUILTIN_VARS, STAGE_ID, PlanFile

PLAN_KEYS = set(schema.PlanHead.model_fields)
STAGE_KEYS = set(schema.Stage.model_fields)
SMOKE_KEYS = set(schema.Smoke.model_fields)
_ID_RE = re.compile(STAGE_ID)


class PlanError(UserError):
    """A plan file that cannot be used; `errors` holds every problem, one line each, `findings` the same as records."""

    def __init__(self, findings: list[Finding]):
        self.findings = findings
        self.errors = [str(f) for f in findings]
        super().__init__(self.errors[0])


def load_plan(path: str | Path) -> Plan:
    """Read, parse and validate a plan file; raise PlanError listing every problem."""
    p = Path(path)
    try:
        raw = read_input(p, "plan")
    except UserError as e:
        raise PlanError([Finding(str(p), None, str(e).removeprefix(f"{p}: "))]) from None
    return parse_plan(raw, str(p))


def parse_plan(raw: bytes | str, filename: str = "<plan>") -> Plan:
    plan, findings = inspect_plan(raw, filename)
    if findings or plan is None:
        raise PlanError(findings)
    return plan


def inspect_plan(raw: bytes | str, filename: str = "<plan>") -> tuple[Plan | None, list[Finding]]:
    """(the plan, []) for a good file; else (the plan of the stages and keys that are right, or None; every
    problem, sorted by line)."""
    text, data = _text(raw, filename)
    if text is None:
        return None, [data]
    sm = SourceMap(text)
    raw_vars, raw_stages = data.get("vars"), data.get("stage")
    context = {"known": set(BUILTIN_VARS) | set(raw_vars if isinstance(raw_vars, dict) else ())}
    doc, problems = validate(PlanFile, data, context)
    findings = [_finding(p, data, sm, filename) for p in problems]
    kept = list(range(len(raw_stages))) if isinstance(raw_stages, list) else []
    right = data
    for attempt in range(3):     # the keys and stages that are right, for what spans stages and for lint
        if doc is not None:
            break
        right, kept = _pruned(right, problems, kept, whole_stages=attempt > 0)
        doc, problems = validate(PlanFile, right, context)
    plan = None
    if isinstance(doc, PlanFile):
        ids = [s.get("id") for s in raw_stages if isinstance(s, dict)] if isinstance(raw_stages, list) else []
        plan = _plan(doc, kept, sm, filename, findings, {i for i in ids if isinstance(i, str)})
    findings = sorted(dict.fromkeys(findings), key=lambda f: f.line or 0)
    return (plan if plan is not None and plan.stages else None), findings


def _text(raw: bytes | str, filename: str) -> tuple[str | None, Any]:
    """(the text, its TOML document), or (None, the Finding that says why there is none)."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw.count(b"\n", 0, e.start) + 1
            return None, Finding(filename, line, f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})")
    else:
        text = raw
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return None, _toml_error(str(e), text, filename)
    except ValueError as e:
        m = re.match(r"(\d+): (.*)", toml_value_error(text, filename, e)[len(filename) + 1:])
        return None, Finding(filename, int(m.group(1)), m.group(2)) if m else Finding(filename, None, str(e))
    except RecursionError:
        data = None
    if data is None or too_deep(data):
        return None, Finding(filename, deep_line(text), f"arrays or tables nested deeper than {MAX_DEPTH} levels")
    return text, data


def _toml_error(msg: str, text: str, filename: str) -> Finding:
    msg = msg.replace("\n", " ")
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)\s*$", msg)
    if m:
        return Finding(filename, int(m.group(1)), f"invalid TOML: {msg[:m.start()]} (column {m.group(2)})")
    m = re.search(r"\s*\(at end of document\)\s*$", msg)
    if m:
        last = max(1, text.count("\n") + (0 if text.endswith("\n") or not text else 1))
        return Finding(filename, last, f"invalid TOML: {msg[:m.start()]} (at end of file)")
    return Finding(filename, 1, f"invalid TOML: {msg}")


# -- a problem in words ---------------------------------------------------------------------------
def _finding(p: Problem, data: dict, sm: SourceMap, filename: str) -> Finding:
    """The problem as `plan check` says it: the stage it is in, what (`verify[0] min_lines: min`), how."""
    loc, stage, head = p.loc, None, ""
    if len(loc) >= 2 and loc[0] == "stage" and isinstance(loc[1], int):
        sid = data["stage"][loc[1]].get("id") if isinstance(data["stage"][loc[1]], dict) else None
        if isinstance(sid, str) and _ID_RE.match(sid):
            stage = sid
        else:
            head = f"stage #{loc[1] + 1}" if len(loc) == 2 else f"stage #{loc[1] + 1}: "
        rest = loc[2:]
    elif len(loc) >= 2:
        head, rest = f"[{loc[0]}]: ", loc[1:]
    else:
        head, rest = (f"[{loc[0]}]" if loc and loc[0] in ("plan", "vars") else str(loc[0]) if loc else ""), ()
    if rest and rest[-1] == "[key]":
        message = f"{_path(rest[:-2])}: " * bool(rest[:-2]) + f"bad variable name {brief(rest[-2])} ({p.text})"
    elif p.how == "unknown":
        where, key = _path(rest[:-1]).rstrip(":"), brief(rest[-1] if rest else p.text)
        message = (f"{where}: " * bool(where) + f"unknown key {key} (expected one of: {', '.join(p.known)})"
                   if head or rest[:-1] or stage else
                   f"unknown top-level key {key} (expected one of: {', '.join(p.known)})")
    else:
        what = _path(rest) if rest else head.rstrip(": ")
        head = head if rest else ""
        message = {"must": f"{what} must be {p.text}, got {brief(p.got)}", "is": f"{what} {p.text}",
                   "at": f"{what}: {p.text}", "say": p.text, "missing": f"{what} is required",
                   "tag": f"{what}: unknown check kind {brief(p.got)} (known: {', '.join(p.known)})"}[p.how]
    return Finding(filename, sm.line_of(loc), head + message, stage)


def _path(parts: tuple[str | int, ...]) -> str:
    """`verify[0] min_lines: min`, `env.HOME`, `smoke.verify[1]`: where in a table a value is."""
    out = ""
    for k, part in enumerate(parts):
        if isinstance(part, int):
            out += f"[{part}]"
        elif k >= 2 and isinstance(parts[k - 1], int) and part in CHECK_KINDS:
            out += f" {part}:"
        else:
            out += (" " if out.endswith(":") else "." if out else "") + part
    return out


# -- the right part of a wrong file -----------------------------------------------------------
def _pruned(data: dict, problems: list[Problem], kept: list[int], whole_stages: bool) -> tuple[dict, list[int]]:
    """data without the keys that have problems (without their whole stage, with whole_stages or where the id is
    wrong), and the file's index of each stage kept."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    stages = [dict(s) if isinstance(s, dict) else s for s in data.get("stage", [])] \
        if isinstance(data.get("stage"), list) else []
    dropped: set[int] = set()
    for p in problems:
        loc = p.loc
        if len(loc) >= 2 and loc[0] == "stage" and isinstance(loc[1], int):
            if whole_stages or len(loc) == 2 or loc[2] == "id":
                dropped.add(loc[1])
            elif loc[2] == "command":      # a no-op in its place: its stage's other keys are still checked
                stages[loc[1]]["command"] = ":"
            else:
                stages[loc[1]].pop(loc[2], None)
        elif len(loc) >= 2 and isinstance(data.get(loc[0]), dict):
            data[loc[0]].pop(loc[1], None)
        elif loc:
            data.pop(loc[0], None)
    if "stage" in data:
        data["stage"] = [s for n, s in enumerate(stages) if n not in dropped]
    return data, [i for n, i in enumerate(kept) if n not in dropped]


# -- records ------------------------------------------------------------------------------------
def _plan(doc: PlanFile, kept: list[int], sm: SourceMap, filename: str, findings: list[Finding],
          ids: set[str]) -> Plan:
    """The Plan of a valid document; what spans stages (ids, dependencies, variables) added to findings."""
    head = doc.plan
    stages: list[Stage] = []
    seen: dict[str, int] = {}
    deps_line: dict[str, int] = {}
    for i, st in zip(kept, doc.stage):
        stage = _stage(st, i, sm)
        if stage.id in seen:
            findings.append(Finding(filename, stage.line, f"duplicate stage id (first defined at line "
                                                          f"{seen[stage.id]})", stage.id))
            continue
        seen[stage.id], deps_line[stage.id] = stage.line or 1, sm.stage_key(i, "depends_on")
        stages.append(stage)
    for s in stages:
        line = deps_line[s.id]
        for d in s.depends_on:
            if d == s.id:
                findings.append(Finding(filename, line, "depends on itself", s.id))
            elif d not in ids | set(seen):
                findings.append(Finding(filename, line, f"unknown dependency {brief(d)} (stages: "
                                                        f"{', '.join(sorted(ids | set(seen)))})", s.id))
    cycle = find_cycle(stages)
    if cycle:
        findings.append(Finding(filename, deps_line[cycle[0]],
                                f"dependency cycle: {' -> '.join(cycle)}", cycle[0]))
    findings.extend(_var_cycle(dict(doc.vars), sm, filename))
    return Plan(name=head.name or Path(filename).stem or "plan", stages=tuple(stages), description=head.description,
                node=head.node, root=head.root, vars=doc.vars, max_parallel=head.max_parallel, path=filename,
                env=head.env, setup=head.setup)


def _var_cycle(vars_: dict[str, str], sm: SourceMap, filename: str) -> list[Finding]:
    for start in vars_:
        path = [start]
        stack = [iter(VAR_RE.findall(vars_[start]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                path.pop()
            elif nxt == start:
                return [Finding(filename, sm.plan_key("vars", start), f"[vars]: variable cycle "
                                                                       f"{' -> '.join(path + [nxt])}")]
            elif nxt in vars_ and nxt not in path:
                path.append(nxt)
                stack.append(iter(VAR_RE.findall(vars_[nxt])))
    return []


def _stage(st: schema.Stage, i: int, sm: SourceMap) -> Stage:
    verify = _checks(st.verify, i, "", sm)
    return Stage(id=st.id, title=st.title or st.id, command=st.command, priority=Priority(st.priority),
                 depends_on=tuple(st.depends_on), node=st.node, nodes=tuple(st.nodes or ()),
                 nproc_per_node=st.nproc_per_node, rdzv_host=st.rdzv_host, cwd=st.cwd,
                 upload=tuple(Upload(u.src, u.dest) for u in st.upload), outputs=tuple(st.outputs),
                 timeout=st.timeout, retries=st.retries, log=st.log, env=st.env, setup=st.setup,
                 smoke=_smoke(st, verify, i, sm), kind=StageKind(st.kind), verify=verify, todo=tuple(st.todo),
                 port=st.port, line=sm.stage_line(i))


def _smoke(st: schema.Stage, verify: tuple[CheckSpec, ...], i: int, sm: SourceMap) -> Smoke | None:
    smoke = st.smoke or (schema.Smoke.model_construct(args=st.smoke_args) if st.smoke_args is not None else None)
    if smoke is None:
        return None
    command = smoke.command if smoke.command is not None else f"{st.command} {smoke.args}"
    checks = _checks(smoke.verify, i, "smoke", sm) if smoke.verify is not None else verify
    outputs = tuple(smoke.outputs) if smoke.outputs is not None else tuple(st.outputs)
    return Smoke(command=command, verify=_with_outputs(outputs, checks), timeout=smoke.timeout)


def _checks(checks: list, i: int, variant: str, sm: SourceMap) -> tuple[CheckSpec, ...]:
    return tuple(CheckSpec(c.kind, c.model_dump(exclude={"kind"}, exclude_none=True), sm.check_line(i, variant, n))
                 for n, c in enumerate(checks))


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

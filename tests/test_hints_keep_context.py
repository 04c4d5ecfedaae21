"""Every hint keeps its context (issue 39, item 2): a `nodedeck ...` command the CLI or the dashboard prints
carries the workspace, nodes file, plan, node and `--var` that selected what it acts on, so pasted into
another shell, in another directory, it acts on the same node and plan.

Found the way the issue asks: every place in ops/ and tui/ that prints a command is built by ops.hints (the
static test below looks at every string literal of the code); then each hint, printed in a non-default
context (a workspace, node gpu1 on the loopback sshd, a --var holding a space), is pasted back from another
directory: those that act are run and must act on gpu1 with the same variable, the others (a node setup,
a decommission) are parsed and must name the same context.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import time
import uuid
from pathlib import Path

import pytest

import ops
import tui
from cli.main import _default_to_tui, build_parser, main
from tests.support.tmux_sessions import kill_plan_sessions

REPO = Path(ops.__file__).resolve().parent.parent

MENTIONS = {
    ("ops/demo.py", "# written by `nodedeck demo`"): "a mark in the demo's nodes.toml, not a hint",
    ("ops/demo.py", "(no nodes.toml written by `nodedeck demo`)"): "says which command wrote the file",
    ("ops/workspace.py", "`nodedeck demo` writes it"): "says which command writes the file",
    ("ops/setup/steps.py", "nodedeck node setup"): "the face a setup names in the node's lock file",
}
"""String literals that name a nodedeck command without asking the user to run it."""


def _commands() -> dict[str, set[str]]:
    """nodedeck's commands, each with its subcommands (empty for a command without them)."""
    parser = build_parser()
    assert parser.commands is not None
    out = {}
    for name, sub in parser.commands.choices.items():
        subs = [a for a in sub._actions if a.__class__.__name__ == "_SubParsersAction"]
        out[name] = set(subs[0].choices) if subs else set()
    return out


def _docstrings_and_help(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for stmt in body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    found.add(id(stmt.value))
        if isinstance(node, ast.keyword) and node.arg in ("help", "description"):
            found |= {id(sub) for sub in ast.walk(node.value)}
    return found


def test_every_command_the_code_prints_is_built_with_its_context():
    commands = _commands()
    pattern = re.compile(r"(?:^|[`(]|: |run |with )nodedeck ([a-z-]+)(?: ([a-z-]+))?")
    literal = []
    for path in sorted([*Path(ops.__file__).parent.rglob("*.py"), *Path(tui.__file__).parent.rglob("*.py")]):
        rel = str(path.relative_to(REPO))
        if rel == "ops/hints.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _docstrings_and_help(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip:
                continue
            for m in pattern.finditer(node.value):
                cmd, sub = m.group(1), m.group(2)
                if cmd not in commands or (commands[cmd] and sub not in commands[cmd]):
                    continue   # `nodedeck does not`, `nodedeck state file`
                if not any(rel == f and text in node.value for f, text in MENTIONS):
                    literal.append(f"{rel}:{node.lineno}: {node.value.strip()[:90]}")
    assert literal == [], "commands printed without their context (build them with ops.hints):\n" + "\n".join(literal)


# -- the hints of a real context, pasted back -------------------------------------------------------------------
def _hints(text: str) -> list[str]:
    return re.findall(r"`(nodedeck [^`]+)`", text)


def _argv(hint: str, **placeholders: str) -> list[str]:
    words = shlex.split(hint)
    assert words[0] == "nodedeck"
    return [placeholders.get(w, w) for w in words[1:]]


class Context:
    """The context the user chose, and what a pasted command's flags say it is."""

    def __init__(self, work: Path, plan: Path, node: str, out: str):
        self.work, self.plan, self.node, self.out = work, plan, node, out

    @property
    def root(self) -> list[str]:
        return ["--work", str(self.work)]

    @property
    def on_plan(self) -> list[str]:
        return ["--plan", str(self.plan), "--node", self.node, "--var", f"out={self.out}"]

    def of(self, argv: list[str]) -> dict:
        """What a command line selects: its workspace (resolved as nodedeck does), plan, node and vars."""
        parser = build_parser()
        assert parser.commands is not None
        args = parser.parse_args(_default_to_tui(argv, parser.commands.choices))
        plan = getattr(args, "plan_file", None) or getattr(args, "plan", None)
        return {"work": os.path.realpath(args.workspace_dir) if args.workspace_dir else None,
                "config": args.config, "plan": os.path.realpath(plan) if isinstance(plan, str) else None,
                "node": getattr(args, "node", None) or getattr(args, "agent_node", None),
                "vars": getattr(args, "var", None)}

    def expected(self, *, plan: bool) -> dict:
        return {"work": os.path.realpath(self.work), "config": None,
                "plan": os.path.realpath(self.plan) if plan else None, "node": self.node,
                "vars": [f"out={self.out}"] if plan else None}


@pytest.fixture
def context(tmp_path, sshd, monkeypatch):
    """A workspace whose nodes.toml has gpu1 (the loopback sshd) beside local, a plan with no node of its own
    and a variable `out`, set to a path with a space; the commands are run from another directory."""
    name = f"ctx{uuid.uuid4().hex[:8]}"
    work = tmp_path / "ws"
    work.mkdir()
    (work / "nodedeck.toml").write_text('[workspace]\nnodes = "nodes.toml"\nstate = "state"\n')
    (work / "nodes.toml").write_text(
        f'[nodes.local]\nroot = "{tmp_path / "local-root"}"\n'
        f'[nodes.gpu1]\nssh = "{sshd.alias}"\nssh_config = "{sshd.ssh_config}"\nroot = "{tmp_path / "gpu1-root"}"\n'
        'connect_timeout = 5\nretire_after = "2020-01-01T00:00"\n')
    plan = tmp_path / "plans" / "p.toml"
    plan.parent.mkdir()
    plan.write_text(f'''[plan]
name = "{name}"
[vars]
out = "{tmp_path / "default-out"}"
[[stage]]
id = "make"
title = "make the made file"
command = "mkdir -p ${{out}} && echo made > ${{out}}/made.txt"
verify = [{{ kind = "file_exists", path = "${{out}}/made.txt" }}]
smoke = {{ command = "echo smoke", verify = [{{ kind = "log_contains", pattern = "smoke" }}] }}
[[stage]]
id = "slow"
title = "sleep a while"
command = "sleep 60"
[[stage]]
id = "after"
title = "after the slow one"
depends_on = ["slow"]
command = "true"
[[stage]]
id = "trainer"
title = "run the trainer"
depends_on = ["after"]
command = "nodedeck-train --version"
''')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    yield Context(work, plan, "gpu1", str(tmp_path / "nd out"))
    kill_plan_sessions(name)


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out + err


def _views(capsys, ctx: Context, *, node: bool = True) -> dict[str, dict]:
    argv = [*ctx.root, "plan", "show", str(ctx.plan), "--json"]
    if node:
        argv += ["--node", ctx.node, "--var", f"out={ctx.out}"]
    rc, out = _run(capsys, argv)
    assert rc == 0, out
    return {v["id"]: v for v in json.loads(out[out.index("{"):])["stages"]}


def _until(capsys, ctx: Context, stage: str, ok, what: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        v = _views(capsys, ctx)[stage]
        if ok(v):
            return v
        assert time.monotonic() < deadline, f"{what}: {v}"
        time.sleep(0.3)


def _paste(capsys, monkeypatch, tmp_path, hint: str, **placeholders: str) -> str:
    """Run a hint as a user pasting it into a shell in yet another directory; its output."""
    other = tmp_path / f"paste-{uuid.uuid4().hex[:6]}"
    other.mkdir()
    monkeypatch.chdir(other)
    rc, out = _run(capsys, _argv(hint, **placeholders))
    assert rc == 0, f"{hint}\n{out}"
    return out


@pytest.mark.timeout(300)
def test_stage_hints_pasted_act_on_the_same_node_plan_and_var(context, capsys, monkeypatch, tmp_path):
    ctx = context
    rc, out = _run(capsys, [*ctx.root, "stage", "start", "make", *ctx.on_plan])
    assert rc == 2
    smoke, force = _hints(out)
    for hint in (smoke, force):
        assert ctx.of(_argv(hint)) == ctx.expected(plan=True), hint
    _paste(capsys, monkeypatch, tmp_path, smoke)
    _until(capsys, ctx, "make", lambda v: v["smoke_verified"], "the smoke run of make verified on gpu1")

    assert _run(capsys, [*ctx.root, "stage", "start", "slow", *ctx.on_plan])[0] == 0
    rc, out = _run(capsys, [*ctx.root, "stage", "start", "slow", *ctx.on_plan])
    assert rc == 2
    [restart] = _hints(out)
    assert ctx.of(_argv(restart)) == ctx.expected(plan=True)
    _paste(capsys, monkeypatch, tmp_path, restart)

    rc, out = _run(capsys, [*ctx.root, "stage", "start", "after", *ctx.on_plan])
    assert rc == 2
    [force] = _hints(out)
    _paste(capsys, monkeypatch, tmp_path, force)
    _until(capsys, ctx, "after", lambda v: v["state"] == "completed", "after, forced, completed on gpu1")

    rc, out = _run(capsys, [*ctx.root, "stage", "start", "make", *ctx.on_plan])   # the full run now
    assert rc == 0, out
    _until(capsys, ctx, "make", lambda v: v["state"] == "completed", "make completed on gpu1")
    assert (Path(ctx.out) / "made.txt").read_text() == "made\n"     # with the --var's value, whole
    views = _views(capsys, ctx)
    assert views["slow"]["state"] == "running" and views["slow"]["node"] == "gpu1"
    assert {v["state"] for v in _views(capsys, ctx, node=False).values()} <= {"pending", "ready"}   # none ran on local
    assert not (tmp_path / "default-out").exists()
    assert _run(capsys, [*ctx.root, "stage", "stop", "slow", *ctx.on_plan, "--grace", "1"])[0] == 0


@pytest.mark.timeout(300)
def test_node_and_state_hints_pasted_act_on_the_same_node(context, capsys, monkeypatch, tmp_path):
    ctx = context
    # commands that name their node: pasted, they must reach gpu1 of the workspace's nodes.toml
    rc, out = _run(capsys, [*ctx.root, "tmux", "logs", "gpu1", "nosuch"])
    [ls] = _hints(out)
    _paste(capsys, monkeypatch, tmp_path, ls)

    rc, out = _run(capsys, [*ctx.root, "baseline", "gpu1"])
    [record] = _hints(out)
    _paste(capsys, monkeypatch, tmp_path, record, TOKENS_PER_S="123")
    rc, out = _run(capsys, [*ctx.root, "baseline", "gpu1", "--json"])
    assert json.loads(out)["baseline"]["tokens_per_s"] == 123

    todos = tmp_path / "todos.json"
    todos.write_text(json.dumps([{"id": "1", "content": "check the node", "status": "pending", "priority": "high"}]))
    rc, out = _run(capsys, [*ctx.root, "todo", "list", "--node", "gpu1"])
    [add] = _hints(out)
    _paste(capsys, monkeypatch, tmp_path, add, FILE=str(todos))
    rc, out = _run(capsys, [*ctx.root, "todo", "list", "--node", "gpu1"])
    assert "check the node" in out

    # the state file's restore hint names the workspace's state
    assert _run(capsys, [*ctx.root, "state", "backup", "gpu1"])[0] == 0
    damaged = ctx.work / "state" / "nodedeck" / "nodes" / "gpu1.sqlite"
    with open(damaged, "r+b") as f:
        f.seek(-4096, os.SEEK_END)
        f.write(b"\xff" * 4096)
    rc, out = _run(capsys, [*ctx.root, "stage", "start", "slow", *ctx.on_plan])
    assert rc == 2
    [restore] = _hints(out)
    assert "restored" in _paste(capsys, monkeypatch, tmp_path, restore)
    assert _run(capsys, [*ctx.root, "state", "check", "gpu1"])[0] == 0


@pytest.mark.timeout(300)
def test_hints_that_are_not_run_here_name_the_same_context(context, capsys):
    """A node setup (minutes of pip), a decommission, a list of agents: parsed, they name the same
    workspace and node."""
    ctx = context
    rc, out = _run(capsys, [*ctx.root, "nodes", "--check", "--timeout", "5"])
    [setup] = _hints(out)
    assert _argv(setup)[2:] == ["node", "setup", "gpu1"] and ctx.of(_argv(setup))["work"] == ctx.expected(
        plan=False)["work"]

    rc, out = _run(capsys, [*ctx.root, "plan", "check", str(ctx.plan), "--node", "gpu1"])
    assert _hints(out) and all(_argv(h)[:4] == [*ctx.root, "node", "setup"] for h in _hints(out))

    rc, out = _run(capsys, [*ctx.root, "alerts", "gpu1"])
    [decommission] = _hints(out)
    assert _argv(decommission)[:4] == [*ctx.root, "decommission", "gpu1"]

    rc, out = _run(capsys, [*ctx.root, "todo", "audit", *ctx.on_plan, "--agent", "opencode", "--agent-node", "gpu1"])
    [agents] = _hints(out)
    assert ctx.of(_argv(agents))["node"] == "gpu1" and ctx.of(_argv(agents))["work"] == ctx.expected(
        plan=False)["work"]

    agent_list = Path(ctx.work) / "todo.json"
    agent_list.write_text(json.dumps([{"id": "1", "content": "make the made file", "status": "completed",
                                       "priority": "high"}]))
    rc, out = _run(capsys, [*ctx.root, "todo", "audit", *ctx.on_plan, "--agent", f"todowrite:{agent_list}"])
    [link] = _hints(out)
    argv = _argv(link)
    assert ctx.of(argv) == ctx.expected(plan=True) and argv[argv.index("--agent") + 1] == f"todowrite:{agent_list}"

    from ops import hints

    hints.given(plan=str(ctx.plan), node=ctx.node, variables=[f"out={ctx.out}"])
    try:
        from ops.node_handle import NodeHandles
        from ops.plan.parse import load_plan
        from ops.run.scheduler import Scheduler
        from ops.workspace import resolve

        resolve(str(ctx.work)).activate()   # type: ignore[union-attr]
        nodes = NodeHandles(str(ctx.work / "nodes.toml"))
        try:
            sched = Scheduler(load_plan(ctx.plan), nodes, node_name=ctx.node)
            run_again = sched.hints.plan_file("plan", "run")
        finally:
            nodes.close()
    finally:
        hints.given()
    assert ctx.of(_argv(run_again)) == ctx.expected(plan=True) and _argv(run_again)[2:4] == ["plan", "run"]

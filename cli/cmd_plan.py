"""`nodedeck plan`, `nodedeck stage`, `nodedeck todo`: pipeline plans from the command line.

plan check FILE...          validate (nothing is started): every problem, `file:line: ...`, exit 2; --json
plan schema                 the plan file's JSON Schema
plan show FILE              every stage whole: state, detail, check results
plan run FILE               drive the plan until every stage is done or failed (exit 0 only if all completed)
stage start|stop|restart|verify|skip|unskip|logs|attach ID --plan FILE  (logs, attach: [--node-rank R])
todo export|import|follow|list|done|set
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from cli.common import host_key_flag, json_flag, plan_args, plan_scheduler
from cli.output import emit_json
from cli.todo_agents import cmd_follow_agent, register_todo
from ops import workspace
from ops.agents.export import export_as
from ops.errors import HostError, UserError
from ops.hints import current
from ops.hosts.local import LocalHost
from ops.node_handle import NodeHandles
from ops.outcome import plan_outcome
from ops.plan.findings import check_file
from ops.plan.records import Finding
from ops.plan.resolve import apply_overrides, parse_overrides
from ops.plan.schema import PlanFile
from ops.run.left_running import servers_left_running
from ops.run.node_fit import lacking, missing_trainers
from ops.run.progress import read_progress
from ops.run.scheduler import Scheduler
from ops.run.todowrite import ManualTodos, TodoFollower, load_todos
from ops.run.views import StageView
from ops.setup.record import recorded
from ops.state import StateStore
from ops.textsafe import shown
from ops.tmux.attach import inside_tmux, run_attach


# -- helpers ----------------------------------------------------------------------
def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def print_view(v: StageView, *, indent: str = "") -> None:
    """A stage, whole: nothing is cut, however long."""
    flags = []
    if v.has_smoke:
        flags.append("smoke verified" if v.smoke_verified else "smoke not yet verified")
    if v.attempt > 1:
        flags.append(f"attempt {v.attempt}")
    if v.smoke and v.state.active:
        flags.append("smoke run")
    state = "completed, down now" if v.down_after_up else v.state.value
    print(f"{indent}{v.id}  [{state}]  {v.priority.value}  {v.kind.value} on {v.node_name}"
          + (f"  ({', '.join(flags)})" if flags else ""))
    print(f"{indent}  {shown(v.title)}")
    print(f"{indent}  depends on: {', '.join(v.depends_on) if v.depends_on else '-'}")
    if v.ranks:
        print(f"{indent}  {v.ranks_line()}")
    if v.detail:
        print(f"{indent}  {shown(v.detail)}")
    now = time.time()
    for c in v.checks:
        print(f"{indent}  {shown(c.line(now))}")


def _stamp() -> str:
    return time.strftime("%H:%M:%S")


# -- plan -------------------------------------------------------------------------
def cmd_check(args) -> int:
    """Every problem of each file at once (ops.plan.findings), then what --node lacks; exit 2 on any error."""
    found: list[Finding] = []
    for f in args.files:
        plan, findings = check_file(f, getattr(args, "config", None))
        if plan is not None and getattr(args, "node", None):
            try:
                findings += [Finding(f, None, line) for line in _node_lacks(plan, args)]
            except HostError as e:   # the file is still checked; what the node has is not
                findings.append(Finding(f, None, f"{args.node} not probed, its GPUs and engines are unchecked: "
                                                 f"{e}", severity="warning"))
        errors = [x for x in findings if x.severity == "error"]
        if plan is not None and not errors:
            findings += [Finding(f, None, line, severity="warning") for line in _missing_trainers(plan, args)]
        found += findings
        if not errors and not args.json:
            n = len(plan.stages) if plan is not None else 0
            print(f"ok: {n} stage{'' if n == 1 else 's'} ({f})")
    ok = not any(x.severity == "error" for x in found)
    if args.json:
        emit_json({"ok": ok, "findings": [x.to_json() for x in found]})
    else:
        for x in found:
            print(f"nodedeck: {shown(f'warning: {x.message}' if x.severity == 'warning' else str(x))}",
                  file=sys.stderr)
    return 0 if ok else 2


def cmd_schema(args) -> int:
    """The plan file's JSON Schema, derived from its declaration (ops.plan.schema)."""
    emit_json(PlanFile.model_json_schema())
    return 0


def _node_lacks(plan, args) -> list[str]:
    """What --node lacks for the plan (its GPUs, engines, launchers), probed on it (ops.run.node_fit)."""
    plan = apply_overrides(plan, workspace.plan_vars(workspace.current(), plan.vars, parse_overrides(
        getattr(args, "var", None))))
    nodes = NodeHandles(getattr(args, "config", None))
    try:
        return lacking(Scheduler(plan, nodes, node_name=args.node), args.node)
    finally:
        nodes.close()


def _missing_trainers(plan, args) -> list[str]:
    """Which nodes run nodedeck-train for the plan without a recorded setup, said before anything launches."""
    plan = apply_overrides(plan, workspace.plan_vars(workspace.current(), plan.vars, parse_overrides(
        getattr(args, "var", None))))
    return list(missing_trainers(plan, getattr(args, "node", None), recorded))


def _warn_missing_trainers(plan, args) -> None:
    for line in _missing_trainers(plan, args):
        print(f"nodedeck: warning: {line}", file=sys.stderr)


def _progress(sched: Scheduler, v: StageView):
    """The running stage's last progress record (`$NODEDECK_PROGRESS`), None when it wrote none."""
    if v.state.value != "running" or v.tmux_session is None:
        return None
    handle = sched.ctx.handle(sched.plan.stage(v.id))
    return read_progress(handle.host, handle.runner.progress_path(v.tmux_session))


def cmd_show(args) -> int:
    sched, nodes = plan_scheduler(args)
    try:
        res = sched.tick()
        progress = {v.id: _progress(sched, v) for v in res.views}
    finally:
        nodes.close()
    if args.json:
        stages = []
        for v in res.views:
            p = progress.get(v.id)
            stages.append({**v.to_json(), "progress": p.to_json() if p else None})
        emit_json({"plan": sched.plan.name, "path": sched.plan.path, "ok": res.ok, "stages": stages})
        return 0
    print(f"plan {sched.plan.name}: {sched.plan.description}".rstrip(": "))
    for v in res.views:
        print_view(v)
        if progress.get(v.id):
            print(f"  progress {progress[v.id].describe()}")
    return 0


def cmd_run(args) -> int:
    def listener(ev):   # with --json, stdout carries only the JSON result
        print(f"{_stamp()} {shown(ev.message)}", file=sys.stderr if args.json else sys.stdout, flush=True)

    sched, nodes = plan_scheduler(args, auto=True, listener=listener, smoke_only=args.smoke_only)
    _warn_missing_trainers(sched.plan, args)
    try:
        res = sched.run(poll=args.poll, once=args.once)
    except KeyboardInterrupt:
        print(f"{_stamp()} interrupted: runs already started go on in tmux; `{sched.hints.plan_file('plan', 'run')}` "
              "picks them up again", file=sys.stderr)
        return 130
    finally:
        nodes.close()
    if args.json:
        emit_json({"plan": sched.plan.name, "ok": res.ok, "done": res.done, "stages": [v.to_json() for v in res.views]})
    else:
        counts: dict[str, int] = {}
        for v in res.views:
            counts[v.state.value] = counts.get(v.state.value, 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in counts.items())
        print(f"{_stamp()} plan {sched.plan.name}: {summary}")
        for v in res.views:
            if not v.state.satisfies_dependents:
                print(f"  {v.id} [{v.state.value}]: {shown(v.detail)}")
        for server in servers_left_running(sched):
            print(f"  {server.line()}")
    return 0 if res.ok else 1


def cmd_outcome(args) -> int:
    sched, nodes = plan_scheduler(args)
    try:
        outcome = plan_outcome(sched)
    finally:
        nodes.close()
    if args.json:
        emit_json({"plan": sched.plan.name, **outcome.to_json()})
    else:
        for line in outcome.lines():
            print(line)
    return 1 if outcome.slower or outcome.gap else 0


# -- stage ------------------------------------------------------------------------
def cmd_stage(args) -> int:
    sched, nodes = plan_scheduler(args)
    try:
        action = args.action
        if action == "logs":
            return _logs(sched, args)
        if action == "attach":
            return _attach(sched, args, nodes)
        if action == "start":
            view = sched.start(args.stage_id, smoke=args.smoke, force=args.force)
        elif action == "restart":
            view = sched.restart(args.stage_id, smoke=args.smoke, force=args.force)
        elif action == "stop":
            view = sched.stop(args.stage_id, grace=args.grace)
        elif action == "verify":
            view = sched.verify(args.stage_id)
        elif action == "skip":
            view = sched.skip(args.stage_id)
        elif action == "unskip":
            view = sched.unskip(args.stage_id)
        else:  # argparse only lets the actions above through
            raise UserError(f"unknown stage action {action}")
    finally:
        nodes.close()
    if args.json:
        emit_json(view.to_json())
    else:
        print_view(view)
    verified = view.state.value == "completed" and not view.down_after_up   # a server down serves nothing now
    return 0 if action != "verify" or verified else 1


def _attach(sched: Scheduler, args, nodes) -> int:
    """Attach this terminal to the stage's tmux session until the user detaches (--json: print how, attach nothing).
    Inside tmux: switch this client to it, or open it in a new tmux window (ops.tmux.attach.inside_tmux)."""
    cmd = sched.attach_command(args.stage_id, args.node_rank)
    cmd = inside_tmux(cmd) or cmd
    if args.json:
        emit_json(cmd.to_json())
        return 0
    nodes.close()   # the terminal is the user's until they detach
    if cmd.how == "attach":
        print(f"nodedeck: attaching to {cmd.tmux_name} on {cmd.node}; detach with C-b d", file=sys.stderr)
    rc, err = run_attach(cmd)
    if rc != 0:
        print(f"nodedeck: attach to {cmd.tmux_name} on {cmd.node} failed: {err or f'exit {rc}'}", file=sys.stderr)
    return rc


def _logs(sched: Scheduler, args) -> int:
    stage = sched.plan.stage(args.stage_id)
    handle, tmux_session = sched.ctx.rank_tmux_session(stage.id, args.node_rank)
    runner = handle.runner
    if args.follow:
        for chunk in runner.follow(tmux_session, lines=args.lines):
            sys.stdout.write(chunk)
            sys.stdout.flush()
        return 0
    text = runner.tail(tmux_session, args.lines)
    if args.json:
        emit_json({"stage": stage.id, "node": handle.name, "node_rank": args.node_rank, "session": tmux_session,
                   "log_path": runner.log_path(tmux_session), "text": text})
    else:
        sys.stdout.write(text)
    if not text:
        never = sched.view(stage.id).started_at is None
        print(f"nodedeck: stage {stage.id}: " + ("it has not run yet: no log" if never else
              f"its log {runner.log_path(tmux_session)} is empty"), file=sys.stderr)
        return 1
    return 0


# -- todo -------------------------------------------------------------------------
def _store(args):
    return StateStore.for_node(args.node or "local")


def cmd_todo_export(args) -> int:
    sched, nodes = plan_scheduler(args)
    try:
        res = sched.tick()
        manual = ManualTodos(sched.ctx.handle(sched.plan.stages[0]).store).items() if args.with_manual else []
    finally:
        nodes.close()
    doc = export_as(args.format, res.views, manual)
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    if args.out:
        LocalHost().write_file(args.out, text.encode())
        n = len(doc["todos"]) if isinstance(doc, dict) else len(doc)
        print(f"wrote {n} todos to {args.out} ({args.format} format)")
    else:
        sys.stdout.write(text)
    return 0


def cmd_todo_import(args) -> int:
    items = load_todos(args.file, number_missing_ids=False)
    added, updated = ManualTodos(_store(args)).import_items(items, replace=args.replace)
    print(f"imported {len(items)} todos from {args.file} into node {args.node or 'local'}: "
          f"{added} new, {updated} updated")
    return 0


def _print_todos(items, *, prefix: str = "") -> None:
    marks = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]", "cancelled": "[-]"}
    for i in items:
        print(f"{prefix}{marks[i.status]} {shown(i.id)}  {i.priority.value:<6}  {shown(i.content)}")


def cmd_todo_list(args) -> int:
    items = ManualTodos(_store(args)).items()
    if args.json:
        emit_json({"todos": [i.to_json() for i in items]})
    elif not items:
        where = ("--node", args.node) if args.node else ()
        print(f"no manual todos on node {args.node or 'local'} "
              f"(add some with `{current().command('todo', 'import', 'FILE', *where)}`)")
    else:
        _print_todos(items)
    return 0


def cmd_todo_set(args) -> int:
    status = "completed" if args.todo_cmd == "done" else args.status
    item = ManualTodos(_store(args)).set_status(args.todo_id, status)
    if args.json:
        emit_json(item.to_json())
    else:
        _print_todos([item])
    return 0


def cmd_todo_follow(args) -> int:
    if args.agent:
        return cmd_follow_agent(args)
    if not args.file:
        raise UserError("todo follow needs a FILE or --agent opencode|claude[:SESSION]")

    follower = TodoFollower(args.file)
    try:
        while True:
            st = follower.poll()
            if st.changed or args.once:
                if args.json:
                    print(json.dumps({"error": st.error, "todos": [i.to_json() for i in st.items]}), flush=True)
                else:
                    print(f"{_stamp()} {args.file}: {len(st.items)} todos"
                          + (f" (last read failed: {shown(st.error)})" if st.error else ""), flush=True)
                    _print_todos(st.items, prefix="  ")
            if args.once:
                return 0 if st.error is None else 2
            time.sleep(args.poll)
    except KeyboardInterrupt:
        return 0


# -- registration -----------------------------------------------------------------
def _common(p: argparse.ArgumentParser, *, plan_opt: bool) -> None:
    plan_args(p, positional=not plan_opt)
    json_flag(p)


def register(sub) -> None:
    plan = sub.add_parser("plan", help="check, show and run pipeline plans")
    psub = plan.add_subparsers(dest="plan_cmd", required=True, parser_class=type(plan))

    p = psub.add_parser("check", help="validate plan files (every problem at once); nothing is started")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--node", help="the node that stages without a node run on (default: the plan's, else local)")
    p.add_argument("--var", action="append", metavar="NAME=VALUE", help="override a [vars] entry (repeatable)")
    json_flag(p, help="print {ok, findings: [{file, line, severity, message, stage}]}")
    p.set_defaults(func=cmd_check)

    p = psub.add_parser("schema", help="print the plan file's JSON Schema")
    p.set_defaults(func=cmd_schema, look_only=True)

    p = psub.add_parser("show", help="every stage with its state and check results")
    _common(p, plan_opt=False)
    p.set_defaults(func=cmd_show, look_only=True)

    p = psub.add_parser("run", help="run the plan until every stage is completed or failed")
    _common(p, plan_opt=False)
    p.add_argument("--once", action="store_true", help="one pass (look, launch what is ready) and exit")
    p.add_argument("--poll", type=float, default=5.0, metavar="S", help="seconds between passes (default 5)")
    p.add_argument("--smoke-only", action="store_true", help="run only the smoke variants (and stages without one)")
    p.set_defaults(func=cmd_run)

    p = psub.add_parser("outcome", help="acceptance length, throughput with and without the drafter, speedup")
    _common(p, plan_opt=False)
    p.set_defaults(func=cmd_outcome, look_only=True)

    stage = sub.add_parser("stage", help="start, stop, restart, verify, skip a stage, or read its log")
    ssub = stage.add_subparsers(dest="action", required=True, parser_class=type(stage))
    for action, text in (("start", "launch the stage"), ("restart", "stop it if it runs, then launch it"),
                         ("stop", "stop its run"), ("verify", "run its verify checks again"),
                         ("skip", "mark it skipped (its dependents may go on)"),
                         ("unskip", "undo a skip: the stage shows its own run's verdict again"),
                         ("logs", "print its log"),
                         ("attach", "attach this terminal to its tmux session (--json: print the command only)")):
        p = ssub.add_parser(action, help=text)
        p.add_argument("stage_id", metavar="ID")
        _common(p, plan_opt=True)
        if action in ("start", "restart"):
            g = p.add_mutually_exclusive_group()
            g.add_argument("--smoke", action="store_true", help="run the smoke variant")
            g.add_argument("--force", action="store_true", help="start even before dependencies or the smoke run")
        if action == "stop":
            p.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
        if action in ("logs", "attach"):
            p.add_argument("--node-rank", type=int, default=0, metavar="R",
                           help="on a stage with several nodes: node-rank R's, on its node (default 0)")
        if action == "logs":
            p.add_argument("--lines", "-n", type=int, default=200)
            p.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends")
        p.set_defaults(func=cmd_stage, look_only=action in ("logs", "attach"))

    todo = sub.add_parser("todo", help="todowrite JSON: export a plan, import or follow todo lists")
    tsub = todo.add_subparsers(dest="todo_cmd", required=True, parser_class=type(todo))
    p = tsub.add_parser("export", help="the plan's stages as todowrite JSON")
    _common(p, plan_opt=True)
    p.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--with-manual", action="store_true", help="append the node's manual todos")
    p.add_argument("--format", choices=["todowrite", "opencode", "claude"], default="todowrite",
                   help="the agent format to write (default todowrite)")
    p.set_defaults(func=cmd_todo_export)

    p = tsub.add_parser("import", help="add a todowrite file's items as manual todos of a node")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--node", help="node whose todo list gets them (default local)")
    p.add_argument("--replace", action="store_true", help="replace the node's manual todos instead of merging")
    p.set_defaults(func=cmd_todo_import)

    p = tsub.add_parser("list", help="the manual todos of a node")
    p.add_argument("--node")
    json_flag(p)
    p.set_defaults(func=cmd_todo_list, look_only=True)

    p = tsub.add_parser("done", help="tick a manual todo")
    p.add_argument("todo_id", metavar="ID")
    p.add_argument("--node")
    json_flag(p)
    p.set_defaults(func=cmd_todo_set)

    p = tsub.add_parser("set", help="set a manual todo's status")
    p.add_argument("todo_id", metavar="ID")
    p.add_argument("status", choices=["pending", "in_progress", "completed", "cancelled"])
    p.add_argument("--node")
    json_flag(p)
    p.set_defaults(func=cmd_todo_set)

    p = tsub.add_parser("follow", help="print a todowrite file or a coding agent's list each time it changes")
    p.add_argument("file", metavar="FILE", nargs="?")
    p.add_argument("--agent", metavar="SPEC", help="follow opencode[:SESSION] or claude[:SESSION] (newest by default)")
    p.add_argument("--agent-node", metavar="NODE", help="the agent runs on this node (read over SSH)")
    host_key_flag(p)
    p.add_argument("--once", action="store_true", help="print it once and exit")
    p.add_argument("--poll", type=float, default=1.0, metavar="S")
    json_flag(p, "one JSON object per change")
    p.set_defaults(func=cmd_todo_follow)
    register_todo(tsub)

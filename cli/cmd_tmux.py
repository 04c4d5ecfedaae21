"""`nodedeck tmux ls|start|stop|logs`: commands in tmux sessions on a node, tracked by PID and start time."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from cli.common import host_key_flag, json_flag, number, open_node
from cli.output import emit_json, emit_table
from ops.errors import UserError
from ops.hints import current
from ops.state import RunRecord
from ops.tmux import RunStatus, tmux_name


def _lines(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of lines")
    return int(text)


def _env(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return key, value


def register(sub) -> None:
    top = sub.add_parser("tmux", help="commands in tmux sessions on a node: ls, start, stop, logs")
    tsub = top.add_subparsers(dest="tmux_command", metavar="{ls,start,stop,logs}", parser_class=type(top))
    top.set_defaults(func=lambda args: (top.print_help(), 2)[1])

    def node_parser(name: str, help: str) -> argparse.ArgumentParser:
        p = tsub.add_parser(name, help=help)
        p.add_argument("node")
        host_key_flag(p)
        return p

    p = node_parser("ls", help="sessions nodedeck started on a node, checked on the node now")
    json_flag(p)
    p.set_defaults(func=cmd_ls, look_only=True)

    p = node_parser("start", help="start a command in a tmux session: nodedeck tmux start NODE SESSION -- CMD...")
    p.add_argument("session")
    p.add_argument("argv", nargs="+", metavar="CMD", help="the command and its arguments (after --)")
    p.add_argument("--cwd", help="directory on the node (relative: under the node root; default: the root)")
    p.add_argument("--log", help="log file on the node (relative: under the node root; default: the run dir)")
    p.add_argument("--env", type=_env, action="append", default=[], metavar="KEY=VALUE",
                   help="set a variable (repeatable)")
    p.add_argument("--shell", action="store_true", help="CMD is one shell command line, run by bash -c")
    p.add_argument("--alive-timeout", type=number(float, zero_ok=True, unit="seconds"), default=10.0,
                   help="seconds to wait to see it alive (default 10)")
    json_flag(p, "print the run record as JSON")
    p.set_defaults(func=cmd_start)

    p = node_parser("stop", help="stop a session: SIGTERM to its recorded process group, SIGKILL after grace")
    p.add_argument("session")
    p.add_argument("--grace", type=number(float, zero_ok=True, unit="seconds"), default=10.0,
                   help="seconds between SIGTERM and SIGKILL (default 10)")
    json_flag(p, "print the result as JSON")
    p.set_defaults(func=cmd_stop)

    p = node_parser("logs", help="print a session's log (-f: follow while it runs)")
    p.add_argument("session")
    p.add_argument("-n", "--lines", type=_lines, default=200, help="lines from the end (default 200)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    p.set_defaults(func=cmd_logs, look_only=True)


def _when(ts: float | None) -> str:
    return "" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _run_json(run: RunRecord | RunStatus) -> dict:
    """--json's object: the fields in order, the session under its stored key `session`, then tmux's name."""
    doc = {("session" if k == "tmux_session" else k): v for k, v in dataclasses.asdict(run).items()}
    return {**doc, "tmux_session": tmux_name(run.tmux_session)}


def cmd_ls(args) -> int:
    with open_node(args) as handle:
        statuses = handle.runner.list()
    if args.json:
        emit_json([_run_json(s) for s in statuses])
        return 0
    emit_table(
        ["session", "state", "pid", "exit", "stage", "started", "ended", "log"],
        [[s.tmux_session, s.state, s.pid, s.exit_code, s.stage, _when(s.started_at), _when(s.ended_at), s.log_path]
         for s in statuses],
    )
    return 0


def cmd_start(args) -> int:
    if args.shell and len(args.argv) != 1:
        raise UserError("--shell takes the command line as one argument (quote it)")
    command = args.argv[0] if args.shell else args.argv
    with open_node(args) as handle:
        rec = handle.runner.start(
            args.session, command,
            cwd=handle.resolve(args.cwd) if args.cwd else handle.root,
            log_path=handle.resolve(args.log) if args.log else None,
            env=dict(args.env) or None,
            alive_timeout=args.alive_timeout,
        )
        tail = handle.runner.tail(args.session, 10) if rec.state != "running" else ""
    if args.json:
        emit_json(_run_json(rec))
    elif rec.state == "running":
        print(f"started {rec.tmux_session} on {args.node} (pid {rec.pid}, tmux session {tmux_name(rec.tmux_session)}); "
              f"log: {rec.log_path}")
    else:
        print(f"{rec.tmux_session} on {args.node} already exited with status {rec.exit_code}; log: {rec.log_path}")
        sys.stdout.write(tail)
    return 0 if rec.state == "running" or rec.exit_code == 0 else 1


def cmd_stop(args) -> int:
    with open_node(args) as handle:
        res = handle.runner.stop(args.session, grace=args.grace)
    if args.json:
        fields = dataclasses.asdict(res)
        emit_json({"session": fields.pop("tmux_session"), **fields, "stopped": res.stopped})   # keys as before
    else:
        print(res.message)
    return 1 if res.outcome == "gone" else 0


def cmd_logs(args) -> int:
    with open_node(args) as handle:
        if handle.store.latest_tmux_session_run(args.session) is None:
            raise UserError(f"no session {args.session} on {args.node} (`{current().command('tmux', 'ls', args.node)}` "
                            "lists them)")
        runner = handle.runner
        if not args.follow:
            sys.stdout.write(runner.tail(args.session, args.lines))
            return 0
        for text in runner.follow(args.session, lines=args.lines):
            sys.stdout.write(text)
            sys.stdout.flush()
        st = runner.status(args.session)
    how = f"exited with status {st.exit_code}" if st.state == "exited" else st.state
    print(f"nodedeck: {args.session} {how}", file=sys.stderr)
    return 0

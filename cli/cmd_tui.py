"""`nodedeck tui`: the dashboard (also what `nodedeck` alone opens).

    nodedeck tui [--node N] [--plan FILE] [--follow-todo FILE] [--follow-agent AGENT[:SESSION]]
                 [--refresh S] [--metrics FILE]

Quitting leaves every stage running in tmux on its node, and names the plan's servers left running, each
with the command that stops it. It needs a terminal: with stdout or stdin not one it says so and starts
nothing. With --screenshot the
dashboard runs headless, writes an SVG of its first complete refresh, and exits.
A crash of the dashboard exits non-zero (Textual's return code, 1), after Textual printed what happened.
Textual is imported only when the command runs: ops itself never needs it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.common import host_key_flag, require_terminal
from ops import hints, workspace
from ops.errors import UserError
from ops.outcome import closing_lines
from ops.plan.parse import load_plan
from ops.plan.resolve import parse_overrides
from ops.run.left_running import servers_left_running


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.1 <= v <= 3600:
        raise argparse.ArgumentTypeError("must be from 0.1 to 3600 seconds")
    return v


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected WIDTHxHEIGHT, e.g. 200x50") from None
    if not (40 <= w <= 1000 and 12 <= h <= 500):
        raise argparse.ArgumentTypeError(f"{text!r}: width 40..1000, height 12..500")
    return w, h


def cmd_tui(args) -> int:
    from tui.app import NodedeckApp  # lazy: Textual loads only when the dashboard opens
    from tui.live import LiveSource  # lazy: Textual loads only when the dashboard opens

    if not args.screenshot:
        context = hints.current()
        require_terminal(f"`{context.plan_file('plan', 'run')}` runs a plan without it, "
                         f"`{context.plan_file('plan', 'show')}` shows it, `{context.command('fleet')}` the nodes")
    if args.follow_todo and not Path(args.follow_todo).parent.is_dir():
        raise UserError(f"{args.follow_todo}: its directory does not exist")
    source = LiveSource(
        config_path=args.config,
        node=args.node,
        plan_path=args.plan,
        plan_vars=_vars(args.plan, parse_overrides(args.var), workspace.current()),
        follow_todo=args.follow_todo,
        follow_agent=args.follow_agent,
        metrics_path=args.metrics,
        accept_new_host_key=args.accept_new_host_key,
        auto=args.auto,
    )
    try:
        app = NodedeckApp(source, refresh_s=args.refresh, screenshot=args.screenshot)
        if args.screenshot:
            app.run(headless=True, size=args.size)
            if app.return_code:
                return app.return_code
            print(args.screenshot)
        else:
            app.run()
            if app.return_code:   # it crashed: Textual printed the traceback; no closing lines after it
                return app.return_code
            if source.scheduler is not None:
                for line in closing_lines(source.scheduler):
                    print(line)
                for server in servers_left_running(source.scheduler):
                    print(server.line())
    finally:
        source.close()
    return 0


def _vars(plan_path, given, ws):
    """The workspace's variables that the plan has, then --var."""
    if ws is None or not plan_path:
        return given
    return workspace.plan_vars(ws, load_plan(plan_path).vars, given)


def register(sub) -> None:
    p = sub.add_parser("tui", help="the dashboard (the default command)")
    p.add_argument("--node", help="node to show (default: the plan's node, else local)")
    p.add_argument("--plan", metavar="FILE", help="plan TOML whose stages the todo panel shows and runs")
    p.add_argument("--var", action="append", metavar="NAME=VALUE", help="override a plan [vars] entry (repeatable)")
    p.add_argument("--follow-todo", metavar="FILE", help="a todowrite JSON file to follow beside the plan")
    p.add_argument("--follow-agent", metavar="AGENT[:SESSION]",
                   help="a coding agent's todo list to follow and audit: opencode[:SESSION], claude[:SESSION] "
                        "or todowrite:PATH (newest session by default)")
    p.add_argument("--metrics", metavar="FILE", help="training metrics JSONL on the node (default: the plan's)")
    p.add_argument("--refresh", type=_seconds, default=1.0, metavar="S", help="seconds between polls (default 1)")
    p.add_argument("--auto", action="store_true", help="launch ready stages by themselves, as `plan run` does")
    host_key_flag(p)
    p.add_argument("--screenshot", metavar="FILE.svg", help="run headless, save an SVG of the first refresh, exit")
    p.add_argument("--size", type=_size, default=(200, 50), metavar="WxH", help="--screenshot size (default 200x50)")
    p.set_defaults(func=cmd_tui)

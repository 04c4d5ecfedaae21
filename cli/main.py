"""Entry point of `nodedeck`: builds the parser from every cli/cmd_*.py module.

Each command module has `register(subparsers)`, which adds its subcommands and
sets `func` on them; `func(args)` returns the exit status. Errors that are the
user's or the node's (NodedeckError) print one line and exit 2, never a traceback;
with --json also `{"error": "..."}` on stdout. A command that only looks sets
`look_only` (its state stores take no backup: ops.state.backup.LOOK_ONLY).
Everything a command prints goes through cli.output.TerminalGuard: no node's text reaches the terminal raw.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import os
import pkgutil
import sys

import cli
from cli.output import guarded_output
from ops import hints, workspace
from ops.errors import NodedeckError
from ops.state import backup as state_backup
from ops.textsafe import shown


class _CliParser(argparse.ArgumentParser):
    commands: argparse._SubParsersAction | None = None   # the top parser's subcommands

    def error(self, message):  # one line, exit 2
        self.exit(2, f"nodedeck: error: {message}\n")

    def _check_value(self, action, value):
        """An unknown command (or other choice) names the closest one, as git does."""
        if action.choices is not None and value not in action.choices:
            close = closest(str(value), [str(c) for c in action.choices])
            hint = f"; did you mean '{close}'?" if close else ""
            known = ", ".join(str(c) for c in action.choices)
            what = "unknown command" if isinstance(action, argparse._SubParsersAction) else "invalid choice:"
            raise argparse.ArgumentError(action, f"{what} {str(value)!r}{hint} (choose from {known})")
        super()._check_value(action, value)


def _typo_cost(typed: str, meant: str) -> int:
    """Edits from `typed` to `meant`, weighted as git weighs them when it suggests a command: two letters
    swapped cost nothing, a letter left out 1, a wrong letter 2, a letter too many 3."""
    rows = [list(range(0, 3 * (len(typed) + 1), 3))]   # typed[:i] -> "": i letters too many
    for j in range(1, len(meant) + 1):
        row = [j]
        for i in range(1, len(typed) + 1):
            cost = min(rows[-1][i] + 1, row[i - 1] + 3,
                       rows[-1][i - 1] + (0 if typed[i - 1] == meant[j - 1] else 2))
            if i > 1 and j > 1 and typed[i - 1] == meant[j - 2] and typed[i - 2] == meant[j - 1]:
                cost = min(cost, rows[-2][i - 2])
            row.append(cost)
        rows.append(row)
    return rows[-1][-1]


def closest(typed: str, choices: list[str]) -> str | None:
    """The choice `typed` most likely meant (the one it begins, or the fewest typos away), None when none is near."""
    started = [c for c in choices if len(typed) >= 3 and c.startswith(typed)]
    if len(started) == 1:
        return started[0]
    scored = sorted((_typo_cost(typed, c), -difflib.SequenceMatcher(None, typed, c).ratio(), c) for c in choices)
    return scored[0][2] if scored and scored[0][0] <= min(max(3, len(typed) // 2), len(typed)) else None


def build_parser() -> _CliParser:
    parser = _CliParser(prog="nodedeck", description="Operate GPU nodes that train speculative-decoding drafters.")
    parser.add_argument("--config", help="nodes.toml to use instead of the XDG config one")
    parser.add_argument("--work", dest="workspace_dir", metavar="DIR",
                        help="the workspace (a dir with nodedeck.toml; default: found upward from here)")
    sub = parser.add_subparsers(dest="command", parser_class=_CliParser)
    for mod in sorted(m.name for m in pkgutil.iter_modules(cli.__path__) if m.name.startswith("cmd_")):
        importlib.import_module(f"cli.{mod}").register(sub)
    parser.commands = sub
    return parser


def _default_to_tui(argv: list[str], commands) -> list[str]:
    """`nodedeck [--config F] [tui options]` opens the dashboard: insert `tui` after the root options.
    A word in the command's place that is no command stays there, for the parser to name the closest."""
    if "tui" not in commands or any(a in commands for a in argv) or {"-h", "--help"} & set(argv):
        return argv
    i = 0
    while i < len(argv) and (argv[i] in ("--config", "--work") or argv[i].startswith(("--config=", "--work="))):
        i += 2 if argv[i] in ("--config", "--work") else 1
    if i < len(argv) and not argv[i].startswith("-"):
        return argv
    return [*argv[:i], "tui", *argv[i:]]


def _enter_workspace(args) -> None:
    """Use the workspace's nodes.toml (unless --config) and state; `demo` sets up its own. The flags that
    select what a command acts on are recorded first, for the hints it prints (ops.hints)."""
    plan = getattr(args, "plan_file", None) or getattr(args, "plan", None)
    hints.given(config=args.config, plan=plan if isinstance(plan, str) else None, node=getattr(args, "node", None),
                variables=getattr(args, "var", None))
    if args.command == "demo":
        return
    ws = workspace.resolve(args.workspace_dir)
    if ws is None:
        return
    ws.activate()
    if args.config is None and ws.nodes is not None:
        args.config = str(ws.nodes)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    commands = parser.commands.choices if parser.commands is not None else {}
    argv = _default_to_tui(list(sys.argv[1:] if argv is None else argv), commands)
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2

    state_backup.LOOK_ONLY = bool(getattr(args, "look_only", False))
    try:
        with guarded_output():
            return _run(args)
    finally:
        state_backup.LOOK_ONLY = False
        hints.given()


def _run(args) -> int:
    try:
        _enter_workspace(args)
        return int(args.func(args) or 0)
    except NodedeckError as e:
        print(f"nodedeck: {shown(e)}", file=sys.stderr)
        if getattr(args, "json", False):   # a script reading stdout gets an answer too: one JSON line
            print(json.dumps({"error": str(e)}), flush=True)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `nodedeck ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())

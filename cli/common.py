"""What several commands share: number arguments, the --json and --accept-new-host-key flags, the
plan arguments (and the plan and scheduler they name), and opening the node a command names."""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from ops import workspace
from ops.errors import UserError
from ops.node_handle import NodeHandle, NodeHandles
from ops.nodes import NodeConfig
from ops.plan.parse import load_plan
from ops.plan.resolve import apply_overrides, parse_overrides
from ops.run.scheduler import Scheduler

if TYPE_CHECKING:
    from ops.plan.records import Plan


def number(kind=float, *, zero_ok: bool = False, unit: str = ""):
    """An argparse type: `kind` (float or int) above 0, or at least 0 with zero_ok; errors name `unit`."""
    of_unit = f" of {unit}" if unit else ""
    bound = ("must be 0 or more" if zero_ok else "must be more than 0") + (f" {unit}" if unit else "")

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number{of_unit}") from None
        if v < 0 or (v == 0 and not zero_ok):
            raise argparse.ArgumentTypeError(bound)
        return v

    return parse


def require_terminal(instead: str) -> None:
    """The dashboard draws on a terminal and reads its keys from one: a one-line UserError, before anything
    starts, when stdout or stdin is not a terminal (a pipe, a file), naming what to run `instead`."""
    for name, stream in (("stdout", sys.stdout), ("stdin", sys.stdin)):
        if stream is None or not stream.isatty():
            raise UserError(f"the dashboard needs a terminal and {name} is not one: {instead}")


def json_flag(p: argparse.ArgumentParser, help: str = "print JSON") -> None:
    """--json: the command's result as JSON on stdout (every command that prints a result has it)."""
    p.add_argument("--json", action="store_true", help=help)


def host_key_flag(p: argparse.ArgumentParser) -> None:
    """--accept-new-host-key: every command that connects to a node takes it."""
    p.add_argument("--accept-new-host-key", action="store_true",
                   help="trust and record a host key seen for the first time (a changed key is always refused)")


def plan_args(p: argparse.ArgumentParser, *, positional: bool = False) -> None:
    """The plan file (`--plan FILE`, or FILE first where the command is about the plan itself), --node
    and --var: every command that loads a plan takes them."""
    if positional:
        p.add_argument("plan_file", metavar="FILE")
    else:
        p.add_argument("--plan", dest="plan_file", required=True, metavar="FILE", help="the plan TOML file")
    p.add_argument("--node", help="run stages without a node on this node (default: the plan's, else local)")
    p.add_argument("--var", action="append", metavar="NAME=VALUE", help="override a [vars] entry (repeatable)")


def plan_from_args(args) -> Plan:
    """The plan file plan_args named, its [vars] overridden by --var and the workspace's values."""
    plan = load_plan(args.plan_file)
    given = parse_overrides(getattr(args, "var", None))
    return apply_overrides(plan, workspace.plan_vars(workspace.current(), plan.vars, given))


def plan_scheduler(args, *, auto: bool = False, listener=None,
                   smoke_only: bool = False) -> tuple[Scheduler, NodeHandles]:
    """The Scheduler of the plan plan_args named (--node, --config honoured), and the nodes it runs on."""
    plan = plan_from_args(args)
    nodes = NodeHandles(getattr(args, "config", None))
    return Scheduler(plan, nodes, node_name=getattr(args, "node", None), auto=auto, listener=listener,
                     smoke_only=smoke_only), nodes


@contextmanager
def open_node(args, node: NodeConfig | None = None) -> Iterator[NodeHandle]:
    """`with open_node(args) as handle`: the handle of `node`, or of the node args.node names in args.config,
    honouring --accept-new-host-key, closed when the block ends; every host command is audited into its store."""
    configs = {node.name: node} if node is not None else None
    with NodeHandles(args.config, configs=configs, accept_new_host_key=args.accept_new_host_key) as nodes:
        yield nodes(node.name if node is not None else args.node)

"""`nodedeck node setup NODE`: make a node ready to run plans (ops.setup.steps), one line per step."""

from __future__ import annotations

import sys
from pathlib import Path

from cli.cmd_nodes import _prompting
from cli.common import host_key_flag, json_flag, number, open_node
from cli.output import emit_json
from ops.hints import current
from ops.setup.steps import SetupOptions, SetupRun, StepResult


def register(sub) -> None:
    node = sub.add_parser("node", help="set up a node to run plans (node setup NODE)")
    nsub = node.add_subparsers(dest="node_command", required=True)
    p = nsub.add_parser(
        "setup", help="install this nodedeck's trainer on a node and record it (idempotent: run it again to check)",
        description="Checks python (>= 3.11), disk and GPUs, makes a venv that sees the node's own torch "
                    "(<root>/.nodedeck/venv, --system-site-packages), pushes this nodedeck's wheel, says what pip "
                    "will install and about how big, installs nodedeck[trainer] with the node's torch held, "
                    "verifies nodedeck-train --version there and records it, so plans find nodedeck-train on that "
                    "node without --var. One setup of an environment runs at a time: another is named and waited "
                    "for. Ctrl-C stops what the setup started on the node.")
    p.add_argument("node")
    p.add_argument("--python", metavar="PATH",
                   help="install into this existing env's python on the node (conda, a venv) instead of making one")
    p.add_argument("--env", metavar="DIR", help="where to make the venv on the node (default <root>/.nodedeck/venv)")
    p.add_argument("--wheelhouse", type=Path, metavar="DIR",
                   help="wheels on this machine (`pip download -d DIR ...`): pushed, and installed with --no-index")
    p.add_argument("--torch-index", metavar="URL",
                   help="take torch from this package index when the environment has none: "
                        "https://download.pytorch.org/whl/cpu for a CPU build (a node without GPUs)")
    p.add_argument("--with-node-stack", action="store_true", help="also install the `node` extra (sglang)")
    p.add_argument("--min-free-gib", type=number(float, zero_ok=True, unit="GiB"), default=20.0,
                   help="warn when the work dir's disk has less free (default 20)")
    host_key_flag(p)
    json_flag(p, "print the steps and the recorded setup as JSON (steps also go to stderr as they end)")
    p.set_defaults(func=cmd_setup)


def cmd_setup(args) -> int:
    out = sys.stderr if args.json else sys.stdout
    width = 12

    def show(r: StepResult) -> None:
        print(f"{r.status.value:<8} {r.step:<{width}} {r.detail}  ({r.seconds:.1f}s)", file=out, flush=True)

    options = SetupOptions(python=args.python, env=args.env, wheelhouse=args.wheelhouse,
                           torch_index=args.torch_index, with_node_stack=args.with_node_stack,
                           min_free_gib=args.min_free_gib)
    with open_node(args) as handle:
        _prompting(handle.host)
        print(f"setting up {handle.name} ({handle.node.target})", file=out, flush=True)
        result = SetupRun(options, show).run(handle)   # Ctrl-C stops what it started on the node, then exits 130
    if args.json:
        emit_json(result.to_json())
    elif result.ok and result.setup is not None:
        print(f"{result.node} is ready: plans run nodedeck-train {result.setup.version} from {result.setup.bin_dir}")
    else:
        again = current().command("node", "setup", result.node)
        print(f"{result.node} is not ready: fix the failed step and run `{again}` again (what is done is kept)")
    return 0 if result.ok else 1

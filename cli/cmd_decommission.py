"""`nodedeck decommission NODE --dest DIR`: preserve everything on a node before it is shut down.

Exit status: 0 only with the verdict SAFE TO SHUT DOWN; 1 when something is
not preserved (or with --dry-run, which preserves nothing); 2 on errors.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from cli.common import json_flag
from cli.output import raw_stream
from ops import hints
from ops.decommission.classify import CLASSES, ENV_CLASS, parse_classes
from ops.decommission.events import EventKind, Step, Unit, WizardEvent
from ops.decommission.for_node import open_decommission
from ops.decommission.inputs import Options
from ops.decommission.inventory import ClassTotal, InventorySummary
from ops.decommission.policy import Policy
from ops.decommission.results import DownloadPlan, SafetyVerdict, Selection
from ops.decommission.wizard import STEPS, Decommission
from ops.errors import UserError
from ops.plan.parse import load_plan
from ops.textsafe import shown
from ops.units import human_bytes


def register(sub) -> None:
    p = sub.add_parser(
        "decommission",
        help="preserve a node's work (local copy + S3 check, verified) before shutting it down",
        description="Inventory the node's roots, check what S3 already holds, capture system info, download "
                    "the rest with resume and sha256 verification, write PROGRESS.md and manifest.json, and "
                    "say whether the node is SAFE TO SHUT DOWN. Nothing on the node is ever changed. "
                    f"Classes: {', '.join(CLASSES)}. nodedeck's own environment on the node ({ENV_CLASS}: the "
                    "venv and wheels `nodedeck node setup` made there, which it makes again) is left out unless "
                    f"--include {ENV_CLASS}.",
    )
    p.add_argument("node", help="node name from nodes.toml (or `local`)")
    p.add_argument("--dest", required=True, help="local directory to preserve into")
    p.add_argument("--s3", metavar="URL", help="s3://bucket/prefix where large artifacts may already be stored")
    p.add_argument("--s3-endpoint", metavar="URL", help="S3 endpoint URL (S3-compatible stores)")
    p.add_argument("--s3-profile", metavar="NAME",
                   help="AWS profile for S3 (default: AWS_PROFILE or the default profile)")
    p.add_argument("--root", action="append", default=[], metavar="PATH",
                   help="another path on the node to preserve (repeatable)")
    p.add_argument("--plan", metavar="FILE", help="plan file: its stage outputs are preserved too and its stage "
                                                 "states go into PROGRESS.md")
    p.add_argument("--include", action="append", metavar="CLASS",
                   help=f"always download this class (repeatable); --include {ENV_CLASS} keeps nodedeck's own "
                        "environment too")
    p.add_argument("--exclude", action="append", metavar="CLASS", help="do not preserve this class (repeatable)")
    p.add_argument("--streams", type=int, default=4, metavar="N", help="parallel download streams (default 4)")
    p.add_argument("--trust-s3-size", action="store_true",
                   help="count S3 objects that match by size only (multipart ETag) as preserved")
    p.add_argument("--accept-outside-links", action="store_true",
                   help="a symlink whose target lies outside the roots (its data not preserved) is a warning, "
                        "not NOT SAFE")
    p.add_argument("--python", default="python3", help="the node's python, for `pip freeze` (default python3)")
    p.add_argument("--dry-run", action="store_true", help="only look: print what would be done, write nothing")
    p.add_argument("--yes", action="store_true", help="do not ask before downloading")
    json_flag(p, "JSON lines: one per event, the verdict last")
    p.set_defaults(func=cmd_decommission)


class _Printer:
    """Human output: a line per step and a progress bar with bytes/s on a terminal."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.tty = sys.stderr.isatty()
        self.bar_shown = False
        self.numbers: dict[Step, int] = {name: i for i, (name, _) in enumerate(STEPS, 1)}
        self.titles: dict[Step, str] = dict(STEPS)

    def __call__(self, ev: WizardEvent) -> None:
        if ev.kind == EventKind.PROGRESS:
            if self.tty:
                self._bar(ev)
            return
        self._clear()
        head = f"[{self.numbers[ev.step]}/{len(STEPS)}] {self.titles[ev.step]}"
        if ev.kind == EventKind.START:
            if ev.message:
                print(f"{head}: {shown(ev.message)}", flush=True)
        elif ev.kind == EventKind.WARNING:
            print(f"  warning: {shown(ev.message)}", flush=True)
        elif ev.kind == EventKind.DONE:
            print(f"{head}: {shown(ev.message)}", flush=True)
            if isinstance(ev.data, InventorySummary):
                self._classes(ev.data.classes)
            if isinstance(ev.data, Selection):
                self._own_env(ev.data)

    def _classes(self, classes: tuple[ClassTotal, ...]) -> None:
        for c in classes:
            if c.files:
                print(f"    {c.cls:<14} {c.files:>8} files  {human_bytes(c.bytes):>11}")

    def _own_env(self, selection: Selection) -> None:
        own = selection.row(ENV_CLASS)
        if own.files and own.policy == Policy.SKIP:
            setup = hints.current().command("node", "setup", self.node)
            print(f"    {ENV_CLASS}: nodedeck's own environment on the node ({own.files} files, "
                  f"{human_bytes(own.bytes)}) is left out: `{setup}` makes it again "
                  f"(--include {ENV_CLASS} preserves it)", flush=True)

    def _bar(self, ev: WizardEvent) -> None:
        width = 28
        if ev.total:
            frac = min(1.0, (ev.done or 0) / ev.total)
            bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
            amount = (f"{ev.done}/{ev.total} files" if ev.unit == Unit.FILES
                      else f"{human_bytes(ev.done or 0)}/{human_bytes(ev.total)}")
            line = f"  [{bar}] {frac * 100:5.1f}% {amount}"
        else:
            line = " "
        if ev.rate:
            line += f"  {human_bytes(ev.rate)}/s"
            if ev.total and ev.done is not None and ev.rate > 0:
                line += f"  ETA {int((ev.total - ev.done) / ev.rate)}s"
        line += f"  {ev.message}"
        raw_stream(sys.stderr).write("\r" + shown(line)[:150].ljust(150))
        sys.stderr.flush()
        self.bar_shown = True

    def _clear(self) -> None:
        if self.bar_shown:
            raw_stream(sys.stderr).write("\r" + " " * 150 + "\r")
            sys.stderr.flush()
            self.bar_shown = False


def _json_event(ev: WizardEvent) -> None:
    sys.stdout.write(json.dumps({"event": "step", **ev.to_json()}, default=str) + "\n")
    sys.stdout.flush()


def _confirm(args):
    if args.yes or args.dry_run:
        return None
    if not sys.stdin.isatty():
        raise UserError("pass --yes to download without a terminal (or --dry-run to only look)")

    def ask(plan: DownloadPlan) -> bool:
        try:
            answer = input(f"Download {plan.files} files ({human_bytes(plan.bytes)}) into {plan.dest}? [y/N] ")
        except EOFError:
            return False
        return answer.strip().lower() in ("y", "yes")

    return ask


def cmd_decommission(args) -> int:
    if not 1 <= args.streams <= 64:
        raise UserError(f"--streams {args.streams}: expected 1 to 64")
    opts = Options(
        dest=Path(args.dest),
        roots=list(args.root),
        s3_url=args.s3,
        s3_endpoint=args.s3_endpoint,
        s3_profile=args.s3_profile,
        include=parse_classes(args.include, "--include"),
        exclude=parse_classes(args.exclude, "--exclude"),
        streams=args.streams,
        dry_run=args.dry_run,
        trust_s3_size=args.trust_s3_size,
        accept_outside_links=args.accept_outside_links,
        python=args.python,
    )
    confirm = _confirm(args)
    on_event = _json_event if args.json else _Printer(args.node)
    t0 = time.monotonic()
    plan = load_plan(args.plan) if args.plan else None
    try:
        with open_decommission(args.node, opts, config=args.config, plan=plan, on_event=on_event) as d:
            verdict = d.run(confirm=confirm)
    except OSError as e:  # this machine's disk (the destination)
        raise UserError(f"{e.filename or args.dest}: {e.strerror or e}") from e
    if args.json:
        sys.stdout.write(json.dumps({"event": "verdict", "node": args.node, "dest": str(d.dest),
                                     "seconds": round(time.monotonic() - t0, 3), **verdict.to_json()},
                                    default=str) + "\n")
    else:
        _print_verdict(verdict, d)
    return 0 if verdict.safe else 1


def _print_verdict(verdict: SafetyVerdict, d: Decommission) -> None:
    print()
    print(verdict.headline)
    for m in verdict.missing:
        where = f"{m.path!r}: " if m.path else ""
        print(f"  missing: {where}{shown(m.said)}")
    for w in verdict.warnings:
        print(f"  note: {shown(w)}")
    if verdict.by_choice:
        print(f"  excluded by choice: {len(verdict.by_choice)} files, "
              f"{human_bytes(sum(x.size for x in verdict.by_choice))}")
    if verdict.own_env:
        setup = hints.current().command("node", "setup", d.node)
        print(f"  left out: nodedeck's own environment, {len(verdict.own_env)} files, "
              f"{human_bytes(sum(x.size for x in verdict.own_env))} (`{setup}` makes it again; "
              f"--include {ENV_CLASS} preserves it)")
    if not verdict.dry_run:
        print(f"Notes: {d.dest / 'PROGRESS.md'}  manifest: {d.dest / 'manifest.json'}")

"""`nodedeck fleet` and `nodedeck alerts`: every node at once, and the alerts each one raises.

fleet [--json] [--watch S]          every node of nodes.toml: reachable (or why not), GPUs, running
                                    stages, plan progress, disk headroom, alerts, cost
fleet --tui                         the same as the dashboard's fleet screen (enter opens a node)
alerts NODE|--all [--json]          the active alerts; exit 1 when any is active, else 3 when a node
                                    could not be checked
on_alert failures (and hooks still running at exit) are reported on stderr.
"""

from __future__ import annotations

import sys
import time

from cli.common import host_key_flag, json_flag, number, require_terminal
from cli.output import emit_json, emit_table
from ops import hints
from ops.errors import UserError
from ops.fleet.poller import Fleet
from ops.fleet.status import NodeStatus
from ops.nodes import get_node, load_nodes
from ops.textsafe import shown
from ops.units import human_bytes, human_duration

HOOK_GRACE_S = 2.0          # a one-shot run waits this long for on_alert hooks before it exits
EXIT_UNCHECKED = 3          # `alerts`: no alert active, but a node could not be checked


def register(sub) -> None:
    p = sub.add_parser("fleet", help="every node at once: GPUs, running stages, progress, disks, alerts, cost")
    json_flag(p)
    p.add_argument("--watch", type=number(float, unit="seconds"), metavar="S", help="refresh every S seconds")
    p.add_argument("--timeout", type=number(float, unit="seconds"), default=20.0,
                   help="seconds to wait for slow nodes per round (default 20)")
    host_key_flag(p)
    p.add_argument("--tui", action="store_true", help="the fleet screen of the dashboard (enter opens a node)")
    p.set_defaults(func=cmd_fleet)

    p = sub.add_parser("alerts", help="the active alerts of a node (or --all); exit 1 when any is active, "
                                      "3 when a node could not be checked")
    p.add_argument("node", nargs="?")
    p.add_argument("--all", action="store_true", help="every node of nodes.toml")
    json_flag(p)
    p.add_argument("--timeout", type=number(float, unit="seconds"), default=20.0)
    host_key_flag(p)
    p.set_defaults(func=cmd_alerts)


def _fleet(args, names: list[str] | None = None) -> Fleet:
    nodes = load_nodes(args.config)
    chosen = [get_node(nodes, n) for n in names] if names else list(nodes.values())
    return Fleet(chosen, interval=getattr(args, "watch", None) or 1.0, accept_new_host_key=args.accept_new_host_key,
                 timeout=min(args.timeout, 10.0))


def _gpus(s: NodeStatus) -> str:
    g = s.gpus
    if g is None:
        return "-"
    if not g.count:
        return g.note or "no GPU"
    util = f"{g.util_pct:.0f}%" if g.util_pct is not None else "?"
    mem = (f" {g.mem_used_mib / 1024:.0f}/{g.mem_total_mib / 1024:.0f} GiB"
           if g.mem_used_mib is not None and g.mem_total_mib else "")
    extra = f" {g.temp_c_max:.0f}C" if g.temp_c_max is not None else ""
    extra += f" {g.power_w:.0f}W" if g.power_w is not None else ""
    return f"{g.count}x {util}{mem}{extra}"


def _disk(s: NodeStatus) -> str:
    d = s.disk
    if d is None:
        return "-"
    full = f", full in {human_duration(d.time_to_full_s)}" if d.time_to_full_s is not None else ""
    return f"{d.path} {human_bytes(d.free)} free{full}"


def _cost(s: NodeStatus) -> str:
    c = s.cost
    if c is None:
        return "-"
    more = ""
    if c.projected_more is not None:
        more = f" +{'≥' if c.open_ended else ''}${c.projected_more:,.0f}"
    return f"${c.spent:,.0f} ({c.hours:.1f} h){more}"


def _state(s: NodeStatus) -> str:
    if s.reachable is None:
        return "polling…" if s.polling else "not polled"
    return "up" if s.reachable else f"DOWN: {s.error}"


def print_fleet(rows: list[NodeStatus]) -> None:
    emit_table(["node", "state", "gpus", "running", "progress", "disk", "alerts", "cost"],
               [(s.name, _state(s), _gpus(s), ", ".join(s.running) or "-",
                 ", ".join(f"{p.plan} {p.verified}/{p.total}" for p in s.plans) or "-", _disk(s),
                 str(len(s.alerts)) if s.alerts else "-", _cost(s)) for s in rows])
    for s in rows:
        for a in s.alerts:
            print(f"  {s.name}: {a.severity.value.upper()} {shown(a.message)} ({shown(a.evidence)}; since "
                  f"{time.strftime('%H:%M:%S', time.localtime(a.since))})")
        for e in s.hook_errors:
            print(f"  {s.name}: {shown(e)}")


def _report_hooks(fleet: Fleet) -> None:
    """Before a one-shot run exits: on_alert failures and hooks still running, on stderr."""
    sys.stdout.flush()
    for line in fleet.settle_hooks(HOOK_GRACE_S):
        print(f"nodedeck: {line}", file=sys.stderr)


def _fleet_tui(args) -> int:
    """The dashboard opened on its fleet screen (Textual imported only here)."""
    from tui.app import NodedeckApp  # lazy: Textual loads only when the dashboard opens
    from tui.live import LiveSource  # lazy: Textual loads only when the dashboard opens

    source = LiveSource(config_path=args.config, accept_new_host_key=args.accept_new_host_key,
                        timeout=min(args.timeout, 10.0))
    try:
        NodedeckApp(source, fleet_first=True).run()
    finally:
        source.close()
    return 0


def cmd_fleet(args) -> int:
    if args.tui:
        if args.json or args.watch:
            raise UserError("--tui shows the fleet live: leave out --json and --watch")
        require_terminal(f"`{hints.current().command('fleet')}` prints the fleet (--watch to follow it, --json "
                         "for a script)")
        return _fleet_tui(args)
    fleet = _fleet(args)
    try:
        while True:
            rows = fleet.poll_all(timeout=args.timeout)
            if args.json:
                emit_json({"nodes": [s.to_json() for s in rows]})
            else:
                print_fleet(rows)
            if not args.watch:
                _report_hooks(fleet)
                return 0
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0
    finally:
        fleet.close()


def cmd_alerts(args) -> int:
    if bool(args.node) == bool(args.all):
        raise UserError("name one node, or give --all")
    fleet = _fleet(args, None if args.all else [args.node])
    try:
        rows = fleet.poll_all(timeout=args.timeout)
        _print_alerts(args, rows)
        _report_hooks(fleet)
    finally:
        fleet.close()
    unseen = [s for s in rows if not s.reachable]
    return 1 if any(s.alerts for s in rows) else EXIT_UNCHECKED if unseen else 0


def _print_alerts(args, rows: list[NodeStatus]) -> None:
    alerts = [a for s in rows for a in s.alerts]
    unseen = {s.name: s.error if s.reachable is False else f"no answer within {args.timeout:g}s"
              for s in rows if not s.reachable}          # down, or still being polled at the deadline
    if args.json:
        emit_json({"alerts": [a.to_json() for a in alerts], "unreachable": unseen, "checked": not unseen})
        return
    for s in rows:
        if s.name in unseen:
            print(f"{s.name}: unreachable: {shown(unseen[s.name])}" if s.reachable is False
                  else f"{s.name}: {shown(unseen[s.name])}")
    if not alerts:
        print(f"no active alerts on the nodes that answered; {len(unseen)} of {len(rows)} nodes could not be "
              "checked" if unseen else "no active alerts")
    for a in alerts:
        print(f"{a.node}: {a.severity.value.upper()} {a.kind.value}: {shown(a.message)}")
        since = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(a.since))
        print(f"    evidence: {shown(a.evidence)}; since {since}")

"""`nodedeck todo agents|audit|link|unlink` and `todo follow --agent`: coding agents' todo lists.

todo agents [--node N] [--file F] [--json]             the lists found (agent, session, project, counts)
todo audit --plan FILE --agent SPEC [--json]           each claim held against the node; exit 1 on a contradiction
todo link ITEM STAGE --plan FILE --agent SPEC          link an item (#N or its text) to a stage
todo unlink ITEM --plan FILE --agent SPEC
SPEC: opencode[:SESSION] | claude[:SESSION] | todowrite:PATH (no session: the newest list).
`--agent-node N` reads the agent's list on node N instead of this machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from contextlib import contextmanager
from functools import partial
from typing import Callable, Mapping, Sequence

from cli.common import host_key_flag, json_flag, open_node, plan_args, plan_scheduler
from cli.output import emit_json, emit_table
from ops.agents.audit import AuditReport, Claim, audit
from ops.agents.discover import discover, find
from ops.agents.follow import AgentFollower
from ops.agents.links import LinkStore, find_item
from ops.agents.todos import AgentItem, AgentList, AgentSpec, dependencies, positions
from ops.hints import CliContext
from ops.nodes import get_node, load_nodes
from ops.plan.records import Stage
from ops.textsafe import shown_or

_MARK = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]", "cancelled": "[-]"}
_CLAIM_MARK = {Claim.VERIFIED: "verified", Claim.UNBACKED: "UNBACKED", Claim.CONTRADICTED: "CONTRADICTED",
               Claim.AGREES: "agrees", Claim.UNLINKED: "unlinked"}


@contextmanager
def _agent_host(args):
    """None (this machine), or the host of --agent-node / --node for `todo agents`."""
    name = getattr(args, "agent_node", None)
    if not name:
        yield None
        return

    node = get_node(load_nodes(args.config), name)
    with open_node(args, node) as handle:
        yield handle.host


def _shown(text: str | None) -> str:
    """Someone else's text (a file name, an item, an error naming them) on one line, safe for a terminal."""
    return shown_or(text)


def _when(t: float | None) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


_ORDER = ("completed", "in_progress", "pending", "cancelled")


def _counts(lst: AgentList) -> str:
    """`1 completed 2 pending 1 blocked`: nodedeck's words first, then the agent's own, shown safely."""
    c = lst.counts()
    words = [s for s in _ORDER if c.get(s)] + sorted(s for s in c if s not in _ORDER)
    return " ".join(f"{c[s]} {_shown(s)}" for s in words) or "empty"


def cmd_agents(args) -> int:
    with _agent_host(args) as host:
        lists = discover(host, args.file or ())
    if args.json:
        emit_json({"lists": [a.to_json(with_items=args.items) for a in lists]})
        return 0
    if not lists:
        print("no coding-agent todo lists found (opencode, Claude Code)")
        return 0
    emit_table(["agent", "session", "updated", "items", "project", "path"],
               [(a.agent.value, _shown(a.agent_session), _when(a.updated), _shown(a.error) if a.error else _counts(a),
                 _shown(a.project), _shown(a.path)) for a in lists])
    return 0


def _item_line(item: AgentItem, where: Mapping[str, int]) -> str:
    """`[~] #2 Train the drafter (blocked by #1)`; a status of the agent's own is named: `[?] #3 Eval (urgent)`."""
    extra = [_shown(item.status)] if item.status not in _MARK else []
    graph = dependencies(item, where)
    return (f"{_MARK.get(item.status, '[?]')} #{item.position} {_shown(item.content)}"
            + (f" ({'; '.join(extra + ([_shown(graph)] if graph else []))})" if extra or graph else ""))


def _print_items(items, prefix: str = "  ") -> None:
    where = positions(items)
    for i in items:
        print(f"{prefix}{_item_line(i, where)}")


def cmd_follow_agent(args) -> int:
    with _agent_host(args) as host:
        follower = AgentFollower(args.agent, host)
        try:
            while True:
                st = follower.poll()
                if st.changed or args.once:
                    if args.json:
                        print(json.dumps({"source": st.source.to_json(with_items=False) if st.source else None,
                                          "error": st.error, "items": [i.to_json() for i in st.items]}), flush=True)
                    else:
                        print(f"{time.strftime('%H:%M:%S')} {_shown(follower.label)}: {len(st.items)} todos"
                              + (f" (last read failed: {_shown(st.error)})" if st.error else ""), flush=True)
                        _print_items(st.items)
                if args.once:
                    return 0 if st.error is None else 2
                time.sleep(args.poll)
        except KeyboardInterrupt:
            return 0


def _audit_inputs(args):
    with _agent_host(args) as host:
        lst = find(host, AgentSpec.parse(args.agent))
    sched, nodes = plan_scheduler(args)
    return lst, sched, nodes


def _links(sched) -> LinkStore:
    return LinkStore(sched.ctx.handle(sched.plan.stages[0]).store)


def print_report(lst: AgentList, report: AuditReport, stages: Sequence[Stage] = (),
                 link: Callable[[str, str], str] | None = None) -> None:
    """The audit, item by item, with the plan's dependencies of `stages` under an item that carries the agent's
    own; `link(item, stage)` is the command that links an item to its suggested stage."""
    print(f"{lst.agent.value} session {_shown(lst.agent_session)} ({_shown(lst.path)}): {report.summary()}")
    depends = {s.id: s.depends_on for s in stages}
    where = positions(lst.items)
    for a in report.items:
        flag = "  SMOKE RUN MISSING" if a.smoke_missing else ""
        print(f"  {_item_line(a.item, where)}")
        print(f"      {_CLAIM_MARK[a.claim]}{flag}: {_shown(a.reason)}")
        if a.link is not None and (a.item.blocked_by or a.item.blocks) and depends.get(a.link.stage_id):
            print(f"      plan: stage {a.link.stage_id} after {', '.join(depends[a.link.stage_id])}")
        if a.suggestion and a.link is None:
            how = f"; link it with `{link(f'#{a.item.position}', a.suggestion.stage_id)}`" if link else ""
            print(f"      suggested stage: {a.suggestion.stage_id} (shares: {', '.join(a.suggestion.words)}{how})")


def cmd_audit(args) -> int:
    lst, sched, nodes = _audit_inputs(args)
    try:
        if lst.error:
            print(f"nodedeck: {_shown(lst.error)}", file=sys.stderr)
            return 2
        res = sched.tick()
        views = {v.id: v for v in res.views}
        report = audit(lst.items, sched.plan.stages, views, _links(sched).all(), recheck=sched.verify)
    finally:
        nodes.close()
    if args.json:
        emit_json({"source": lst.to_json(with_items=False), **report.to_json()})
    else:
        print_report(lst, report, sched.plan.stages, partial(_link_command, sched.hints, args))
    return 0 if report.ok else 1


def _link_command(context: CliContext, args, item: str, stage_id: str) -> str:
    """`nodedeck todo link ITEM STAGE` on the audited plan, node and agent list."""
    agent = ["--agent", args.agent] + (["--agent-node", args.agent_node] if args.agent_node else [])
    return context.on_plan("todo", "link", item, stage_id, then=agent)


def cmd_link(args) -> int:
    lst, sched, nodes = _audit_inputs(args)
    try:
        item = find_item(lst.items, args.item)
        links = _links(sched)
        if args.todo_cmd == "unlink":
            removed = links.unlink(item)
            print(f"#{item.position} {_shown(item.content)}: "
                  + ("link removed" if removed else "had no explicit link"))
            return 0
        sched.plan.stage(args.stage_id)   # an unknown stage is a one-line error
        links.link(item, args.stage_id)
    finally:
        nodes.close()
    print(f"#{item.position} {_shown(item.content)} -> stage {args.stage_id}")
    return 0


def _plan_opts(p: argparse.ArgumentParser) -> None:
    plan_args(p)
    p.add_argument("--agent", required=True, metavar="SPEC",
                   help="opencode[:SESSION], claude[:SESSION] or todowrite:PATH")
    p.add_argument("--agent-node", metavar="NODE", help="read the agent's list on this node (default: this machine)")
    host_key_flag(p)


def register_todo(tsub) -> None:
    """The agent subcommands of `nodedeck todo` (called by cmd_plan's registration)."""
    p = tsub.add_parser("agents", help="coding agents' todo lists found here or on a node")
    p.add_argument("--agent-node", "--node", dest="agent_node", metavar="NODE", help="look on this node over SSH")
    p.add_argument("--file", action="append", metavar="FILE", help="also read this todowrite file (repeatable)")
    p.add_argument("--items", action="store_true", help="with --json: include every item")
    host_key_flag(p)
    json_flag(p)
    p.set_defaults(func=cmd_agents)

    p = tsub.add_parser("audit", help="hold an agent's todo claims against the plan's stages on the node")
    _plan_opts(p)
    json_flag(p)
    p.set_defaults(func=cmd_audit)

    for name, text in (("link", "link an agent's todo item to a plan stage"), ("unlink", "remove an item's link")):
        p = tsub.add_parser(name, help=text)
        p.add_argument("item", metavar="ITEM", help="#N (position in the list) or the item's text")
        if name == "link":
            p.add_argument("stage_id", metavar="STAGE")
        _plan_opts(p)
        p.set_defaults(func=cmd_link)

"""Find coding agents' todo lists on the operator's machine or on a node, as typed records.

Locally the scanner (ops.agents.scan) runs in-process; on a node it is sent over the node's
SSH connection as `python3 -c SOURCE HOME FILE...`, so nothing has to be installed there.
CLI: `nodedeck todo agents [--node N] [--json]`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ops import hints, nodenum
from ops.agents import scan
from ops.agents.todos import Agent, AgentItem, AgentList, AgentSpec
from ops.errors import HostError, UserError
from ops.hosts.base import Host
from ops.hosts.local import LocalHost
from ops.textsafe import last_line

_SCAN_SOURCE = Path(scan.__file__).read_text()


def _records(raw: object, node: str) -> list[AgentList]:
    """The scanner's lists as typed records. On a node the scanner's answer is the node's word: every field is
    checked here (types, a finite `updated`, a known agent and status), a wrong one is a HostError naming it."""
    if not isinstance(raw, list):
        raise HostError(f"lists: expected an array, got {type(raw).__name__}")
    return [_record(d, f"lists[{n}]", node) for n, d in enumerate(raw)]


def _field(d: dict, key: str, where: str, kinds: tuple[type, ...], required: bool = False):
    v = d.get(key)
    if (v is None and not required) or (isinstance(v, kinds) and not isinstance(v, bool)):
        return v
    got = "nothing" if v is None else type(v).__name__
    raise HostError(f"{where}.{key}: expected {' or '.join(k.__name__ for k in kinds)}, got {got}")


def _ids(d: dict, key: str, where: str) -> tuple[str, ...]:
    v = _field(d, key, where, (list,)) or []
    if not all(isinstance(x, str) for x in v):
        raise HostError(f"{where}.{key}: expected an array of task ids")
    return tuple(v)


def _record(d: object, where: str, node: str) -> AgentList:
    if not isinstance(d, dict):
        raise HostError(f"{where}: expected an object, got {type(d).__name__}")
    agent = _field(d, "agent", where, (str,), required=True)
    if agent not in scan.AGENTS:
        raise HostError(f"{where}.agent: unknown agent {agent[:40]!r}")
    updated = _field(d, "updated", where, (int, float))
    if updated is not None and nodenum.UNIX_TIME.get(updated) is None:
        raise HostError(f"{where}.updated: {nodenum.describe(updated)} is not a time")
    raw_items = _field(d, "items", where, (list,)) or []
    items = []
    for n, i in enumerate(raw_items):
        at = f"{where}.items[{n}]"
        if not isinstance(i, dict):
            raise HostError(f"{at}: expected an object, got {type(i).__name__}")
        items.append(AgentItem(n + 1, _field(i, "content", at, (str,), required=True),
                               _field(i, "status", at, (str,), required=True),
                               _field(i, "priority", at, (str,)), _field(i, "active_form", at, (str,)),
                               _field(i, "id", at, (str,)), _field(i, "description", at, (str,)),
                               _ids(i, "blocks", at), _ids(i, "blocked_by", at)))
    return AgentList(Agent(agent), str(_field(d, "session", where, (str, int), required=True)),
                     _field(d, "path", where, (str,), required=True), updated, _field(d, "project", where, (str,)),
                     tuple(items), _field(d, "error", where, (str,)), node)


ALL_AGENTS = ("opencode", "claude")


def discover_local(files=(), *, agents=ALL_AGENTS, agent_session: str | None = None,
                   home: str | None = None) -> list[AgentList]:
    """Every agent todo list on this machine (and the todowrite files named)."""
    home = home or os.path.expanduser("~")
    return _records(scan.scan(home, dict(os.environ), list(files), agents, agent_session), "local")


def discover_remote(host: Host, files=(), *, agents=ALL_AGENTS, agent_session: str | None = None,
                    home: str | None = None, timeout: float = 60.0) -> list[AgentList]:
    """Every agent todo list in the node's home directory (or `home`), read on the node by one python3 command."""
    argv = ["python3", "-c", _SCAN_SOURCE, home or host.home(), "--agents", ",".join(agents)]
    if agent_session:
        argv += ["--session", agent_session]
    res = host.run([*argv, *files], timeout=timeout)
    if not res.ok:
        raise HostError(f"{host.name}: scanning for agent todo lists failed (exit {res.returncode})"
                        + (f": {line}" if (line := last_line(res.stderr)) else ""))
    try:
        doc = json.loads(res.stdout)
    except (ValueError, RecursionError) as e:
        raise HostError(f"{host.name}: the agent scanner's answer is not JSON: {e}") from None
    try:
        return _records(doc.get("lists") if isinstance(doc, dict) else doc, host.name)
    except HostError as e:
        raise HostError(f"{host.name}: the agent scanner's answer is malformed: {e}") from None


def is_local(host: Host | None) -> bool:
    return host is None or isinstance(host, LocalHost)


def discover(host: Host | None, files=(), *, agents=ALL_AGENTS, agent_session: str | None = None) -> list[AgentList]:
    """Local when host is None or a LocalHost, else over the host's connection."""
    if host is None or is_local(host):
        return discover_local(files, agents=agents, agent_session=agent_session)
    return discover_remote(host, files, agents=agents, agent_session=agent_session)


def select(lists: list[AgentList], spec: AgentSpec, node: str | None = None) -> AgentList:
    """The list a spec names: its session, or the agent's most recently updated one (looked for on `node`,
    None: here)."""
    mine = [a for a in lists if a.agent is spec.agent]
    if spec.agent is Agent.TODOWRITE:
        mine = [a for a in mine if a.path in spec.files or a.agent_session == spec.agent_session]
    elif spec.agent_session:
        mine = [a for a in mine if a.agent_session.startswith(spec.agent_session)]
        exact = [a for a in mine if a.agent_session == spec.agent_session]
        mine = exact or mine
        if len({a.agent_session for a in mine}) > 1:
            raise UserError(f"{spec.agent.value}:{spec.agent_session} matches several sessions: "
                            + ", ".join(sorted({a.agent_session for a in mine})[:5]))
    if not mine:
        what = f" session {spec.agent_session}" if spec.agent_session else ""
        where = ("--node", node) if node else ()
        look = hints.current().command("todo", "agents", *where)
        raise UserError(f"no {spec.agent.value}{what} todo list found (see `{look}`)")
    return max(mine, key=lambda a: a.updated or 0.0)


def find(host: Host | None, spec: AgentSpec) -> AgentList:
    """The one list a spec names, scanning only that agent's store (here, or on the host)."""
    node = None if host is None or is_local(host) else host.name
    return select(discover(host, spec.files, agents=spec.scanned, agent_session=spec.agent_session), spec, node)

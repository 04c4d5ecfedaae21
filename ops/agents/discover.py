"""Find coding agents' todo lists on the operator's machine or on a node, as typed records.

Locally the scanner (ops.agents.scan) runs in-process; on a node it is sent over the node's
SSH connection as `python3 -c SOURCE HOME FILE...`, so nothing has to be installed there.
CLI: `nodedeck todo agents [--node N] [--json]`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ops.agents import scan
from ops.agents.model import Agent, AgentItem, AgentList, AgentSpec
from ops.errors import HostError, UserError
from ops.hosts.base import Host

_SCAN_SOURCE = Path(scan.__file__).read_text()


def _records(raw: list[dict], node: str) -> list[AgentList]:
    out = []
    for d in raw:
        items = tuple(AgentItem(n + 1, i["content"], i["status"], i.get("priority"), i.get("active_form"), i.get("id"))
                      for n, i in enumerate(d.get("items") or []))
        out.append(AgentList(Agent(d["agent"]), str(d["session"]), d["path"], d.get("updated"), d.get("project"),
                             items, d.get("error"), node))
    return out


ALL_AGENTS = ("opencode", "claude")


def discover_local(files=(), *, agents=ALL_AGENTS, session: str | None = None,
                   home: str | None = None) -> list[AgentList]:
    """Every agent todo list on this machine (and the todowrite files named)."""
    home = home or os.path.expanduser("~")
    return _records(scan.scan(home, dict(os.environ), list(files), agents, session), "local")


def discover_remote(host: Host, files=(), *, agents=ALL_AGENTS, session: str | None = None,
                    home: str | None = None, timeout: float = 60.0) -> list[AgentList]:
    """Every agent todo list in the node's home directory (or `home`), read on the node by one python3 command."""
    argv = ["python3", "-c", _SCAN_SOURCE, home or host.home(), "--agents", ",".join(agents)]
    if session:
        argv += ["--session", session]
    res = host.run([*argv, *files], timeout=timeout)
    if not res.ok:
        tail = res.stderr.decode(errors="replace").strip().splitlines()
        raise HostError(f"{host.name}: scanning for agent todo lists failed (exit {res.returncode})"
                        + (f": {tail[-1]}" if tail else ""))
    try:
        doc = json.loads(res.stdout)
        return _records(doc["lists"], host.name)
    except (ValueError, KeyError, TypeError) as e:
        raise HostError(f"{host.name}: the agent scanner's answer is not JSON: {e}") from None


def is_local(host: Host | None) -> bool:
    from ops.hosts.local import LocalHost

    return host is None or isinstance(host, LocalHost)


def discover(host: Host | None, files=(), *, agents=ALL_AGENTS, session: str | None = None) -> list[AgentList]:
    """Local when host is None or a LocalHost, else over the host's connection."""
    if host is None or is_local(host):
        return discover_local(files, agents=agents, session=session)
    return discover_remote(host, files, agents=agents, session=session)


def select(lists: list[AgentList], spec: AgentSpec) -> AgentList:
    """The list a spec names: its session, or the agent's most recently updated one."""
    mine = [a for a in lists if a.agent is spec.agent]
    if spec.agent is Agent.TODOWRITE:
        mine = [a for a in mine if a.path in spec.files or a.session == spec.session]
    elif spec.session:
        mine = [a for a in mine if a.session == spec.session or a.session.startswith(spec.session)]
        exact = [a for a in mine if a.session == spec.session]
        mine = exact or mine
        if len({a.session for a in mine}) > 1:
            raise UserError(f"{spec.agent.value}:{spec.session} matches several sessions: "
                            + ", ".join(sorted({a.session for a in mine})[:5]))
    if not mine:
        what = f" session {spec.session}" if spec.session else ""
        raise UserError(f"no {spec.agent.value}{what} todo list found (see `nodedeck todo agents`)")
    return max(mine, key=lambda a: a.updated or 0.0)


def find(host: Host | None, spec: AgentSpec) -> AgentList:
    """The one list a spec names, scanning only that agent's store (here, or on the host)."""
    return select(discover(host, spec.files, agents=spec.scanned, session=spec.session), spec)

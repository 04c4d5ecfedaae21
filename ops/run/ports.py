"""A server stage's TCP ports on its node: which they are, who listens on them, and whether that is the stage.

A server stage declares its `port` (`port = "${port}"`); one that declares none has the ports of its http_ok
checks on the node's loopback (127.0.0.1, localhost, ::1). Two rules follow:

- before a server launches, each of its ports must be free on its node: a port in use refuses the launch in
  one line naming what holds it (pid and command line, as the node's /proc shows them, and the nodedeck run it
  is, with its work dir), so a second demo, another workspace or the user's own service is never mistaken for
  the stage's server;
- an http_ok check on one of its ports counts only when a process of the stage's own run listens there (its
  process group, or a descendant of its wrapper): a server that could not bind its port is never declared up
  on another process's answers.

The scan (ops.run.port_scan) runs in-process for LocalHost and as `python3 -c` on a node. Its answer is the
node's word: cut on the node (`head -c`), parsed with every field checked, its text shown through
ops.textsafe.shown; an answer that cannot be read says nothing can be told (the launch goes ahead, the check
counts as before).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from ops import nodejson
from ops.errors import HostError, HostUnreachable, UserError
from ops.hosts.base import Host
from ops.hosts.local import LocalHost
from ops.plan.records import Stage, StageKind, tcp_port
from ops.run import port_scan
from ops.textsafe import shown

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
ANSWER_BYTES = 64 * 1024
_SOURCE = Path(port_scan.__file__).read_text()
_REMOTE = 'python3 -c "$1" "$2" "$3" | head -c "$4"; exit "${PIPESTATUS[0]}"'
_VAR_ONLY = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
_RUNS = "/.nodedeck/runs/"


@dataclass(frozen=True)
class Holder:
    """A process holding a listening socket, as the node's /proc shows it."""

    pid: int
    pgid: int
    ancestors: tuple[int, ...]
    cmd: str           # its command line (node text)
    run: str = ""      # its $NODEDECK_PROGRESS when it is a nodedeck run (node text)

    def of_run(self, pid: int | None, pgid: int | None) -> bool:
        """It is a process of the run whose wrapper is `pid` in group `pgid`."""
        return (pgid is not None and self.pgid == pgid) or (pid is not None and pid in (self.pid, *self.ancestors))

    def describe(self, root: str | None = None) -> str:
        """`pid 4242 (python3 -m http.server 8123)`, and the nodedeck run it is: its tmux session and work dir."""
        text = f"pid {self.pid}" + (f" ({shown(self.cmd)})" if self.cmd else "")
        work = work_dir_of(self)
        if work is not None:
            session = posixpath.basename(self.run).removesuffix(".progress.jsonl")
            here = root is not None and work == posixpath.normpath(root)
            where = "this work dir" if here else f"the work dir {shown(work)}"
            text += f", nodedeck's tmux session {shown(session)} in {where}"
        return text


@dataclass(frozen=True)
class PortScan:
    """Who listens on one port of a node. `known` is False when the node could not tell (no /proc, no python3,
    an answer that does not read)."""

    port: int
    known: bool
    listening: bool = False
    holders: tuple[Holder, ...] = ()

    def foreign(self, pid: int | None, pgid: int | None) -> bool:
        """Something listens on the port, and it is not a process of the run (`pid`, `pgid`; None: no run)."""
        return self.known and self.listening and not any(h.of_run(pid, pgid) for h in self.holders)

    def who(self, root: str | None = None) -> str:
        """The holders in words (`root`: the node's work dir, said as `this work dir`)."""
        if not self.holders:
            return "a process whose files the node does not show (another user's)"
        return "; ".join(h.describe(root) for h in self.holders)


def scan_port(host: Host, port: int, pgid: int | None = None) -> PortScan:
    """Who listens on `port` on the host (the processes of group `pgid` looked at first). HostUnreachable
    propagates; any other failure is an unknown scan."""
    if isinstance(host, LocalHost):
        return _parsed(port, port_scan.scan(port, pgid))
    try:
        res = host.run(["bash", "-c", _REMOTE, "port-scan", _SOURCE, str(port), str(pgid or ""), str(ANSWER_BYTES)],
                       timeout=30)
    except HostUnreachable:
        raise
    except HostError:
        return PortScan(port, False)
    if not res.ok:
        return PortScan(port, False)
    try:
        return _parsed(port, nodejson.loads(res.stdout))
    except ValueError:
        return PortScan(port, False)


def _int(v: Any) -> int:
    if type(v) is not int or not 0 <= v < 1 << 31:
        raise ValueError(f"not a pid: {v!r}")
    return v


def _text(v: Any, limit: int) -> str:
    if not isinstance(v, str):
        raise ValueError("not text")
    return v[:limit]


def _parsed(port: int, doc: Any) -> PortScan:
    """The scan's JSON as a PortScan; ValueError for anything but the shape port_scan prints."""
    if not isinstance(doc, dict) or type(doc.get("proc")) is not bool or type(doc.get("listening")) is not bool:
        raise ValueError("not a port scan")
    raw = doc.get("holders")
    if not isinstance(raw, list) or len(raw) > port_scan.MAX_HOLDERS or not all(isinstance(h, dict) for h in raw):
        raise ValueError("holders: not a list of objects")
    holders = []
    for h in raw:
        ancestors = h.get("ancestors")
        if not isinstance(ancestors, list) or len(ancestors) > port_scan.MAX_DEPTH:
            raise ValueError("ancestors: not a list")
        holders.append(Holder(_int(h.get("pid")), _int(h.get("pgid")), tuple(_int(a) for a in ancestors),
                              _text(h.get("cmd"), port_scan.MAX_CMD), _text(h.get("run"), port_scan.MAX_RUN)))
    return PortScan(port, doc["proc"], doc["listening"] and doc["proc"], tuple(holders))


def port_var(stage: Stage) -> str | None:
    """The plan variable a server stage's port is (`port = "${port}"`), if it is exactly one."""
    m = _VAR_ONLY.match(stage.port or "")
    return m.group(1) if m else None


def server_ports(resolved: Stage) -> tuple[int, ...]:
    """A resolved server stage's ports: its `port`, else those of its http_ok checks on the node's loopback
    (none for a job). UserError for a `port` that did not come to a TCP port."""
    if resolved.kind is not StageKind.SERVER:
        return ()
    if resolved.port is not None:
        port = tcp_port(resolved.port)
        if port is None:
            raise UserError(f"stage '{resolved.id}': port {shown(resolved.port)!r} is not a TCP port (1 to 65535)")
        return (port,)
    found = (_loopback_port(c.args.get("url")) for c in resolved.verify if c.kind == "http_ok")
    return tuple(sorted({p for p in found if p is not None}))


def _loopback_port(url: Any) -> int | None:
    """The port of an http(s) URL on the node's loopback, else None."""
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return port if parts.hostname in LOOPBACK else None


def refuse_taken(host: Host, node_name: str, stage: Stage, resolved: Stage, root: str) -> None:
    """Before a server launches: UserError naming the holder when one of its ports is in use on the node."""
    for port in server_ports(resolved):
        scan = scan_port(host, port)
        if scan.listening:
            var = port_var(stage)
            other = f" (--var {var}=PORT)" if var else ""
            raise UserError(f"port {port} on {node_name} is in use by {scan.who(root)}: nothing launched; "
                            f"stop that, or give stage '{stage.id}' another port{other}")


def not_own(host: Host, resolved: Stage, pid: int | None, pgid: int | None,
            root: str) -> Callable[[str], str | None] | None:
    """For a server's checks: who answers at a URL on one of its ports when that is not a process of its run
    (wrapper `pid`, group `pgid`), else None; None (no function) for a stage with no ports."""
    try:
        ports = server_ports(resolved)
    except UserError:
        return None
    if not ports:
        return None

    def other(url: str) -> str | None:
        port = _loopback_port(url)
        if port not in ports or port is None:
            return None
        scan = scan_port(host, port, pgid)
        return scan.who(root) if scan.foreign(pid, pgid) else None

    return other


def work_dir_of(holder: Holder) -> str | None:
    """The work dir of the nodedeck run a holder is (None: not one)."""
    work, sep, name = holder.run.partition(_RUNS)
    return posixpath.normpath(work) if sep and name and work else None

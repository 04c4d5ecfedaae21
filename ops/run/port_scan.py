"""Who listens on a TCP port of this machine, from /proc; standard library only.

This module also runs on a node, sent over SSH as `python3 -c SOURCE PORT [PGID]` (ops.run.ports),
so it imports nothing but the standard library and prints one JSON object:

    {"proc": true, "listening": true,
     "holders": [{"pid": 4242, "pgid": 4240, "ancestors": [4240, 1], "cmd": "python3 -m http.server 8123",
                  "run": "/w/.nodedeck/runs/nd-demo-serve-1a2b3c.progress.jsonl"}]}

`listening`: a socket in LISTEN on the port (any address, IPv4 or IPv6) in /proc/net/tcp{,6}.
`holders`: processes whose open files include that socket: the processes of group PGID (and their
descendants) first, every other process only when none of those holds it; at most MAX_HOLDERS.
`run` is the holder's $NODEDECK_PROGRESS (a nodedeck run's, naming its tmux session and work dir),
readable for the user's own processes only. `proc` is false where /proc/net/tcp cannot be read
(nothing can be told). Everything read is bounded: pids, file descriptors, bytes per file.
"""

from __future__ import annotations

import json
import os
import sys

LISTEN = "0A"
MAX_HOLDERS = 4
MAX_PIDS = 65536
MAX_FDS = 262144          # file descriptors looked at in all
MAX_TABLE_LINES = 1 << 20
MAX_CMD = 300
MAX_RUN = 500
MAX_DEPTH = 64            # ancestors listed per holder
ENV_BYTES = 1 << 18


def _read(path: str, limit: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(limit)


def listening_inodes(port: int) -> tuple[bool, set[str]]:
    """(whether /proc/net/tcp could be read, the inodes of sockets in LISTEN on `port`)."""
    want = "%04X" % port
    readable, inodes = False, set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name, encoding="ascii", errors="replace") as f:
                readable = True
                for n, line in enumerate(f):
                    if n > MAX_TABLE_LINES:
                        break
                    parts = line.split()
                    if n == 0 or len(parts) < 10:
                        continue
                    if parts[3] == LISTEN and parts[1].rpartition(":")[2].upper() == want and parts[9] != "0":
                        inodes.add(parts[9])
        except OSError:
            continue
    return readable, inodes


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, pgid) of a process, or None when it is gone."""
    try:
        raw = _read("/proc/%d/stat" % pid, 4096).decode("ascii", "replace")
    except OSError:
        return None
    fields = raw.rpartition(")")[2].split()
    if len(fields) < 3 or not fields[1].isdigit() or not fields[2].isdigit():
        return None
    return int(fields[1]), int(fields[2])


def _ancestors(pid: int, parents: dict[int, int]) -> list[int]:
    out: list[int] = []
    while len(out) < MAX_DEPTH:
        pid = parents.get(pid, 0)
        if pid <= 0 or pid in out:
            break
        out.append(pid)
    return out


def _holds(pid: int, targets: set[str], budget: list[int]) -> bool:
    """Whether one of the process's file descriptors is one of the sockets (`socket:[INODE]`)."""
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return False
    for fd in fds:
        budget[0] -= 1
        if budget[0] < 0:
            return False
        try:
            if os.readlink("/proc/%d/fd/%s" % (pid, fd)) in targets:
                return True
        except OSError:
            continue
    return False


def _cmd(pid: int) -> str:
    try:
        raw = _read("/proc/%d/cmdline" % pid, 4 * MAX_CMD)
    except OSError:
        return ""
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")[:MAX_CMD]


def _run(pid: int) -> str:
    try:
        env = _read("/proc/%d/environ" % pid, ENV_BYTES)
    except OSError:
        return ""
    for item in env.split(b"\0"):
        if item.startswith(b"NODEDECK_PROGRESS="):
            return item.partition(b"=")[2].decode("utf-8", "replace")[:MAX_RUN]
    return ""


def scan(port: int, pgid: int | None = None) -> dict:
    """Who listens on `port` (see the module's docstring); `pgid`: the group whose processes are looked at first."""
    readable, inodes = listening_inodes(port)
    out: dict = {"proc": readable, "listening": bool(inodes), "holders": []}
    if not inodes:
        return out
    targets = {"socket:[%s]" % i for i in inodes}
    parents: dict[int, int] = {}
    groups: dict[int, int] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names[:MAX_PIDS]:
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                parents[int(name)], groups[int(name)] = st
    own = [p for p in parents if pgid and (groups[p] == pgid or pgid in _ancestors(p, parents))]
    budget = [MAX_FDS]
    found = [p for p in own if _holds(p, targets, budget)]
    if not found:
        for p in parents:
            if p not in own and len(found) < MAX_HOLDERS and _holds(p, targets, budget):
                found.append(p)
    out["holders"] = [{"pid": p, "pgid": groups[p], "ancestors": _ancestors(p, parents), "cmd": _cmd(p),
                       "run": _run(p)} for p in sorted(found)[:MAX_HOLDERS]]
    return out


def main(argv: list[str]) -> int:
    """`python3 port_scan.py PORT [PGID]`: the scan as one JSON object."""
    port = int(argv[0])
    pgid = int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else None
    json.dump(scan(port, pgid), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""One `node setup` per node environment at a time, and what it started on the node stopped with it.

The lock is held on the node by a keeper: a small stdlib script run by the node's python over its own channel,
which takes `flock` on `<root>/.nodedeck/locks/<env key>.lock`, writes there who holds it (this machine's user,
host and PID, the face that runs it, since when, the keeper's PID on the node) and waits on its stdin. A setup
that finds the lock taken is told who holds it, and waits until it is free (or until it gives up: then nothing
changed). The lock ends with its keeper: released at the end of the setup, or when the channel closes because
nodedeck ended, was killed, or lost the node (no heartbeat for HEARTBEAT_LOST seconds): then the keeper first
stops what the setup started.

Every long command of the setup (making the venv, pip) runs through `wrap()`: it becomes the leader of its own
process group on the node and records its PID and start time in the lock's directory before it execs. `stop()`
(Ctrl-C in the CLI, "stop it" in the dashboard) has the keeper stop each recorded group that is still that process
(the start time checked, as ops/procs.py does): SIGTERM, then SIGKILL after STOP_GRACE seconds; never by name.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ops import nodejson
from ops.errors import HostError, HostTimeout
from ops.hosts.base import Host, HostProcess
from ops.nodenum import PID, UNIX_TIME
from ops.textsafe import printable

LOCKS = "locks"             # under <root>/.nodedeck
HEARTBEAT_S = 5.0
HEARTBEAT_LOST = 60         # the keeper's wait for a sign of life before it stops what it guards
STOP_GRACE = 10             # seconds between SIGTERM and SIGKILL of a recorded process group
_REPLY_S = STOP_GRACE + 20.0
BUSY_EVERY_S = 1.0          # who holds the lock is told again only when it changed, and at most this often
MAX_STOPPED = 100           # the most stopped process groups taken from the keeper's answer to STOP

# Run by the node's python: argv[1] the lock file, argv[2] who holds it (JSON). stdout: `NDK BUSY <held>` once
# while another holds it, `NDK LOCKED <pid>`, then `NDK STOPPED <json>` after each STOP on stdin.
_KEEPER_PY = r"""
import fcntl, json, os, select, signal, sys, time
path, holder = sys.argv[1], json.loads(sys.argv[2])
procs = path + ".procs"
os.makedirs(os.path.dirname(path), exist_ok=True)
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
def say(text):
    os.write(1, (text + "\n").encode())
def gone():  # the client closed its end (or sent nothing for too long)
    r = select.select([0], [], [], 1.0)[0]
    return bool(r) and not os.read(0, 4096)
told = False
while True:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
    except OSError:
        if not told:
            said = os.pread(fd, 4096, 0).decode(errors="replace").replace("\n", " ")
            say("NDK BUSY " + said)
            told = True
        if gone():
            sys.exit(0)
holder["pid"] = os.getpid()
holder["since"] = time.time()
os.ftruncate(fd, 0)
os.pwrite(fd, json.dumps(holder).encode(), 0)
os.makedirs(procs, exist_ok=True)
for name in os.listdir(procs):
    os.unlink(os.path.join(procs, name))
def start_of(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
def alive(group):
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as f:
                    rest = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if rest[2] == str(group) and rest[0] != "Z":
                return True
    return False
def stop_all():
    open(os.path.join(procs, "STOPPED"), "w").close()  # a command registered from now on does not start
    found = []
    for name in os.listdir(procs):
        if not name.isdigit():
            continue
        with open(os.path.join(procs, name)) as f:
            start, _, argv = f.read().partition(" ")
        if start_of(int(name)) == start:
            found.append({"pid": int(name), "argv": argv[:300]})
            try:
                os.killpg(int(name), signal.SIGTERM)
            except OSError:
                pass
    deadline = time.monotonic() + float(sys.argv[3])
    for p in found:
        while alive(p["pid"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(p["pid"]):
            p["killed"] = True
            try:
                os.killpg(p["pid"], signal.SIGKILL)
            except OSError:
                pass
    return found
say("NDK LOCKED %d" % os.getpid())
last, buf = time.monotonic(), b""
while True:
    r = select.select([0], [], [], 1.0)[0]
    if not r:
        if time.monotonic() - last > float(sys.argv[4]):
            stop_all()
            break
        continue
    data = os.read(0, 4096)
    if not data:
        stop_all()
        break
    last, buf = time.monotonic(), buf + data
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        if line == b"STOP":
            say("NDK STOPPED " + json.dumps(stop_all()))
for name in os.listdir(procs):
    os.unlink(os.path.join(procs, name))
"""

# Run by the node's python before a long command: argv[1] the lock's process directory, the rest the command.
# It leads its own process group, records itself (start time, then its command), and execs the command unless
# the setup was stopped meanwhile.
_WRAP_PY = r"""
import os, sys
procs, argv = sys.argv[1], sys.argv[2:]
try:
    os.setpgid(0, 0)
except OSError:
    pass
pid = os.getpid()
if os.getpgid(0) != pid:
    sys.exit("cannot lead a process group of its own: not started")
with open("/proc/self/stat") as f:
    start = f.read().rsplit(")", 1)[1].split()[19]
with open(os.path.join(procs, str(pid)), "w") as f:
    f.write(start + " " + " ".join(argv))
if os.path.exists(os.path.join(procs, "STOPPED")):
    sys.exit("the setup was stopped: not started")
os.execvp(argv[0], argv)
"""


@dataclass(frozen=True)
class Holder:
    """Who holds a node environment's setup lock, as its lock file on the node says (every text printable)."""

    holder: str
    since: float | None
    pid: int | None

    @property
    def text(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.since)) if self.since is not None else "an unknown time"
        pid = f" (pid {self.pid} on the node)" if self.pid is not None else ""
        return f"{self.holder}, since {when}{pid}"


@dataclass(frozen=True)
class Stopped:
    """A process group the keeper stopped on the node: its leader's PID and command."""

    pid: int
    argv: str
    killed: bool  # it outlived SIGTERM and got SIGKILL

    @property
    def text(self) -> str:
        return f"{self.argv} (pid {self.pid} and its process group{', SIGKILL' if self.killed else ''})"


def holder_here(face: str) -> str:
    """Who this nodedeck is, for the lock file: user@host pid, and the face that runs the setup."""
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} ({face})"


def _holder(text: str) -> Holder:
    try:
        d: Any = nodejson.loads(text)
    except ValueError:
        d = None
    if not isinstance(d, dict):
        return Holder(printable(text, 200) or "another setup (its lock file says nothing)", None, None)
    holder = d.get("holder")
    since, pid = UNIX_TIME.get_json(d.get("since")), PID.get_json(d.get("pid"))
    return Holder(printable(holder, 200) if isinstance(holder, str) else "another setup",
                  float(since) if since else None, pid or None)


def _stopped(text: str) -> list[Stopped]:
    """The keeper's answer to STOP; raises HostError (one line) when it is no list of what it stopped."""
    try:
        d: Any = nodejson.loads(text)
    except ValueError as e:
        raise HostError(f"the node's setup keeper answered STOP with no JSON ({printable(str(e), 100)})") from None
    if not isinstance(d, list):
        raise HostError("the node's setup keeper answered STOP with no list of what it stopped")
    found: list[Stopped] = []
    for p in d:
        pid = PID.get_json(p.get("pid")) if isinstance(p, dict) else None
        if pid and len(found) < MAX_STOPPED:
            argv = p.get("argv")
            found.append(Stopped(pid, printable(argv, 300) if isinstance(argv, str) else "", p.get("killed") is True))
    return found


class SetupLock:
    """The lock of one node environment's setup, held by a keeper process on the node (see the module)."""

    def __init__(self, host: Host, python: str, base: str, env: str):
        self.host, self.python = host, python
        self.path = f"{base}/{LOCKS}/{hashlib.sha256(env.encode('utf-8', 'surrogateescape')).hexdigest()[:16]}.lock"
        self.procs = self.path + ".procs"
        self._proc: HostProcess | None = None
        self._write = threading.Lock()
        self._stop_beat = threading.Event()

    def acquire(self, holder: str, on_busy: Callable[[Holder], None], cancelled: Callable[[], bool]) -> Holder | None:
        """Hold the lock, waiting while another setup holds it (on_busy is told who; again only when that
        changes, at most once per BUSY_EVERY_S); returns who was waited for (None: it was free). Raises HostError
        when the keeper cannot run or `cancelled()` turned true (checked at least once a second, whatever the
        keeper says)."""
        proc = self.host.open_process([self.python, "-c", _KEEPER_PY, self.path, json.dumps({"holder": holder}),
                                       str(STOP_GRACE), str(HEARTBEAT_LOST)], timeout=60)
        waited: Holder | None = None
        told: Holder | None = None
        told_at = float("-inf")
        try:
            while True:
                if cancelled():     # every turn: a keeper that keeps talking must not keep the setup waiting
                    raise HostError("stopped while waiting for the setup lock")
                if waited is not None and waited != told and time.monotonic() - told_at >= BUSY_EVERY_S:
                    told, told_at = waited, time.monotonic()
                    on_busy(waited)
                try:
                    line = proc.readline(1.0)[:8192].decode(errors="replace").rstrip("\n")
                except HostTimeout:
                    continue
                if line.startswith("NDK BUSY "):
                    waited = _holder(line[len("NDK BUSY "):])
                elif line.startswith("NDK LOCKED "):
                    break
                else:
                    why = printable(proc.stderr_tail() or line or "it ended", 300)
                    raise HostError(f"the setup lock on the node ({self.path}) could not be taken: {why}")
        except BaseException:
            proc.close()
            raise
        self._proc = proc
        threading.Thread(target=self._beat, daemon=True, name="setup-lock-heartbeat").start()
        return waited

    def _send(self, data: bytes) -> None:
        with self._write:
            if self._proc is not None:
                self._proc.write(data)

    def _beat(self) -> None:
        while not self._stop_beat.wait(HEARTBEAT_S):
            try:
                self._send(b".\n")
            except HostError:
                return

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run as a process group the keeper can stop (the lock must be held)."""
        return [self.python, "-c", _WRAP_PY, self.procs, *argv]

    def stop(self) -> list[Stopped]:
        """Have the keeper stop every process group the setup started that still runs; what it stopped."""
        proc = self._proc
        if proc is None:
            return []
        self._send(b"STOP\n")
        deadline = time.monotonic() + _REPLY_S
        while time.monotonic() < deadline:
            try:
                line = proc.readline(max(0.1, deadline - time.monotonic()))
            except HostTimeout:
                break
            if not line:
                break
            text = line[:65536].decode(errors="replace").rstrip("\n")
            if text.startswith("NDK STOPPED "):
                return _stopped(text[len("NDK STOPPED "):])
        raise HostError(f"the node's setup keeper gave no answer to STOP within {_REPLY_S:g}s")

    def release(self) -> None:
        """Let the lock go: the keeper ends (stopping whatever the setup left running, which is nothing when the
        setup ended)."""
        self._stop_beat.set()
        with self._write:
            proc, self._proc = self._proc, None
        if proc is not None:
            proc.close()

"""Session names and what the runner reports: RunStatus, StopResult, AlreadyRunning."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ops.errors import NodedeckError, UserError

PREFIX = "nd-"
"""Prefix of every tmux session nodedeck creates; it touches no other session."""

SERVER = "nodedeck"
"""The tmux server every stage lives in on its node (`tmux -L nodedeck`, a socket named `nodedeck` in tmux's
socket dir), whoever launched it: independent of the $TMUX of the terminal nodedeck runs in, so closing that
terminal's tmux never ends a stage, and attaching from it is never nesting."""

LEGACY_SERVER = "default"
"""Where stages of older nodedeck versions may still run: the node's default tmux server (`tmux` with no
$TMUX). Looked at too, so a run launched before an upgrade is still found, stopped, cleaned and attached."""

SERVERS = (SERVER, LEGACY_SERVER)

_SESSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


class AlreadyRunning(NodedeckError):
    """A session of that name is alive on the node."""

    def __init__(self, tmux_session: str, pid: int | None, host: str):
        self.tmux_session = tmux_session
        self.pid = pid
        where = f" (pid {pid})" if pid else ""
        super().__init__(f"session {tmux_session} is already running on {host}{where}")


def check_session(tmux_session: str) -> str:
    """Return a valid session name or raise UserError.

    Letters, digits, '_' and '-', at most 63, not starting with '-' or '_':
    tmux rewrites ':' and '.' in names and reads '.' in targets as a pane index.
    """
    if not isinstance(tmux_session, str) or not _SESSION.match(tmux_session):
        raise UserError(f"session name {tmux_session!r}: use 1-63 letters, digits, '_' or '-', "
                        "starting with a letter or digit")
    return tmux_session


def tmux_name(tmux_session: str) -> str:
    """The tmux session of a nodedeck session (`tmux -L nodedeck attach -t =nd-NAME`)."""
    return PREFIX + tmux_session


def progress_path(run_dir: str, full_name: str) -> str:
    """Where a run in the tmux session named `full_name` (nd-...) writes its progress records (`$NODEDECK_PROGRESS`;
    ops.run.progress reads them)."""
    return f"{run_dir.rstrip('/')}/{full_name}.progress.jsonl"


@dataclass(frozen=True)
class RunStatus:
    """What is true on the node about one session right now."""

    tmux_session: str
    state: str
    """running (seen alive now) | starting (just launched, not seen yet) | exited (with exit_code) |
    missing (never launched, nothing on the node) | lost (vanished without an exit status; see detail)"""
    pid: int | None
    proc_start: int | None
    exit_code: int | None
    log_path: str | None
    started_at: float | None
    ended_at: float | None
    run_id: int | None = None
    stage: str | None = None
    detail: str = ""

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def tmux_name(self) -> str:
        """The tmux session's full name, nd-..."""
        return tmux_name(self.tmux_session)


@dataclass(frozen=True)
class StopResult:
    tmux_session: str
    outcome: str
    """terminated (ended after SIGTERM) | killed (needed SIGKILL) | not_running
    | gone (PID gone or reused: nothing killed)"""
    pid: int | None
    exit_code: int | None
    message: str

    @property
    def stopped(self) -> bool:
        return self.outcome in ("terminated", "killed")

"""What one probe of the node saw (NodeView), and what it means for a recorded run (derive)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ops import nodenum
from ops.procs import ProcStat, parse_stat_line
from ops.state import RunRecord
from ops.tmux.sessions import LEGACY_SERVER, PREFIX, SERVER, RunStatus, tmux_name

STARTING_GRACE = 60.0
"""Seconds a run recorded as starting counts as starting (not lost) while its pid file is not seen."""


@dataclass(frozen=True)
class Pane:
    pid: int
    dead: bool
    dead_status: int | None
    dead_signal: int | None
    server: str = SERVER
    """The tmux server it is in (LEGACY_SERVER: launched by an older nodedeck, before stages had their own)."""


@dataclass
class NodeView:
    """Everything one probe saw: nodedeck's tmux panes, pid/exit files, /proc identities."""

    panes: dict[str, Pane] = field(default_factory=dict)
    pid_files: dict[str, tuple[int, int, int]] = field(default_factory=dict)   # session -> (pid, start, pgid)
    exit_files: dict[str, tuple[int, float | None]] = field(default_factory=dict)   # session -> (code, ended)
    procs: dict[int, ProcStat] = field(default_factory=dict)

    def alive(self, pid: int | None, start: int | None) -> bool:
        """pid exists, has not finished, and still has the recorded start time."""
        p = self.procs.get(pid) if pid is not None else None
        return p is not None and p.alive and start is not None and p.start == start


def parse_view(out: str) -> NodeView:
    """Parse what probe_script printed; lines that do not parse (a pid `²`, 400 digits: ops.nodenum) are
    ignored."""
    view = NodeView()
    for line in out.splitlines():
        f = line.split(":") if line.startswith(("T:", "O:")) else line.split("\t")
        if f[0] in ("T", "O") and len(f) == 6 and f[1].startswith(PREFIX) and (pid := nodenum.PID.get(f[2])):
            # the first pane of a session is the one nodedeck made; nodedeck's own server first
            if f[1] not in view.panes:
                view.panes[f[1]] = Pane(pid, f[3] == "1", nodenum.EXIT_STATUS.get(f[4]), nodenum.SIGNAL.get(f[5]),
                                        SERVER if f[0] == "T" else LEGACY_SERVER)
        elif f[0] == "S" and len(f) == 3 and (pid := nodenum.PID.get(f[1])):
            stat = parse_stat_line(pid, f[2])
            if stat:
                view.procs[stat.pid] = stat
        elif f[0] == "P" and len(f) == 4:
            rest = f[3].split() + ["", ""]
            pid, start, pgid = nodenum.PID.get(f[2]), nodenum.START_TICKS.get(rest[0]), nodenum.PGID.get(rest[1])
            if pid is not None and start is not None and pgid is not None:
                view.pid_files[f[1]] = (pid, start, pgid)
        elif f[0] == "E" and len(f) == 4 and (code := nodenum.EXIT_STATUS.get(f[2])) is not None:
            view.exit_files[f[1]] = (code, nodenum.UNIX_TIME.get(f[3]))
    return view


def parse_stop_output(out: str) -> tuple[str, int | None, float | None]:
    """(outcome, exit code, ended) from stop_script's last line."""
    parts = out.split()
    if not parts:
        return "gone", None, None
    code = nodenum.EXIT_STATUS.get(parts[1]) if len(parts) > 1 else None
    ended = nodenum.UNIX_TIME.get(parts[2]) if len(parts) > 2 else None
    return parts[0], code, ended


def derive(rec: RunRecord | None, view: NodeView, *, latest: bool, tmux_session: str | None = None,
           default_log: str | None = None) -> RunStatus:
    """What one probe says about rec (or, with rec None, about an untracked session).

    latest: rec is its session's newest run, so the session's pid and exit files may be its own.
    """
    if rec is not None:
        tmux_session = rec.tmux_session
    if tmux_session is None:
        raise ValueError("derive() needs a run record or a session name")
    pid, start = (rec.pid, rec.proc_start) if rec else (None, None)
    pid_file = view.pid_files.get(tmux_session)
    own_files = latest and (pid is None or (pid_file is not None and pid_file[0] == pid))
    if own_files and pid is None and pid_file is not None:
        pid, start = pid_file[0], pid_file[1]
    exit_file = view.exit_files.get(tmux_session) if own_files else None
    pane = view.panes.get(tmux_name(tmux_session))
    if pane is not None and pane.pid != pid:
        pane = None

    def status(state: str, exit_code: int | None = None, ended_at: float | None = None, detail: str = "") -> RunStatus:
        return RunStatus(
            tmux_session=tmux_session, state=state, pid=pid, proc_start=start, exit_code=exit_code,
            log_path=rec.log_path if rec else default_log, started_at=rec.started_at if rec else None,
            ended_at=ended_at, run_id=rec.id if rec else None, stage=rec.stage if rec else None, detail=detail,
        )

    if exit_file is not None:
        return status("exited", *exit_file)
    if view.alive(pid, start):
        return status("running")
    if rec is not None and rec.state == "exited":
        return status("exited", rec.exit_code, rec.ended_at)
    if pane is not None and pane.dead and pane.dead_status is not None:
        return status("exited", pane.dead_status, detail="ended without writing its exit file")
    if pane is not None and pane.dead and pane.dead_signal is not None:
        return status("exited", 128 + pane.dead_signal, detail=f"killed by signal {pane.dead_signal}")
    if rec is None and pid is None:
        return status("missing")
    if (rec is not None and rec.state == "starting" and (pid is None or pid not in view.procs)
            and time.time() - rec.started_at < STARTING_GRACE):
        return status("starting", detail="launched, not seen alive yet")
    if rec is not None and rec.state == "failed":
        return status("lost", ended_at=rec.ended_at, detail="never started: the launch failed")
    p = view.procs.get(pid) if pid is not None else None
    if p is not None and p.start != start:
        detail = f"pid {pid} now belongs to another process (start time differs)"
    else:
        detail = "ended without an exit status" if pane is not None else "process gone without an exit status"
    return status("lost", ended_at=rec.ended_at if rec is not None and rec.state == "lost" else None, detail=detail)

"""Run stage commands in tmux sessions on a node, and know for sure whether they live.

Each run is a tmux session `nd-<session>` whose pane runs a wrapper script
(`<run_dir>/<session>.sh`). The wrapper first writes its own PID and start time
to `<session>.pid`, runs the command with output appended to the log, then
writes the exit status to `<session>.exit` (temp file + rename). A run counts
as running only while that PID exists with that start time; it is stopped by
signalling its recorded process group after the same check, never by name.
Everything goes through Host.run / run_script, so a LocalHost and an SSHHost
behave the same; every refresh is one round trip however many sessions it covers.
"""

from __future__ import annotations

import codecs
import re
import shlex
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

from ops.errors import HostError, NodedeckError, UserError
from ops.hosts.base import Host, join_argv
from ops.procs import GROUP_ALIVE_FN, STAT_FN, ProcStat, parse_stat_line
from ops.state import RunRecord, StateStore

PREFIX = "nd-"
"""Prefix of every tmux session nodedeck creates; it touches no other session."""

_SESSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# ':' separates: tmux never puts one in a session name, and it prints a tab as '_' to a non-UTF-8 client.
_PANE_FORMAT = "T:#{session_name}:#{pane_pid}:#{pane_dead}:#{pane_dead_status}:#{pane_dead_signal}"


class AlreadyRunning(NodedeckError):
    """A session of that name is alive on the node."""

    def __init__(self, session: str, pid: int | None, host: str):
        self.session = session
        self.pid = pid
        where = f" (pid {pid})" if pid else ""
        super().__init__(f"session {session} is already running on {host}{where}")


def check_session(session: str) -> str:
    """Return a valid session name or raise UserError.

    Letters, digits, '_' and '-', at most 63, not starting with '-' or '_':
    tmux rewrites ':' and '.' in names and reads '.' in targets as a pane index.
    """
    if not isinstance(session, str) or not _SESSION.match(session):
        raise UserError(f"session name {session!r}: use 1-63 letters, digits, '_' or '-', starting with a letter or digit")
    return session


def tmux_name(session: str) -> str:
    return PREFIX + session


@dataclass(frozen=True)
class RunStatus:
    """What is true on the node about one session right now."""

    session: str
    state: str
    """running | exited | missing (never launched, nothing on the node) | lost (vanished without an exit status)"""
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
    def tmux_session(self) -> str:
        return tmux_name(self.session)


@dataclass(frozen=True)
class StopResult:
    session: str
    outcome: str
    """terminated (ended after SIGTERM) | killed (needed SIGKILL) | not_running | gone (PID gone or reused: nothing killed)"""
    pid: int | None
    exit_code: int | None
    message: str

    @property
    def stopped(self) -> bool:
        return self.outcome in ("terminated", "killed")


@dataclass(frozen=True)
class _Pane:
    pid: int
    dead: bool
    dead_status: int | None
    dead_signal: int | None


@dataclass
class _NodeView:
    """Everything one probe saw on the node."""

    panes: dict[str, _Pane]
    pid_files: dict[str, tuple[int, int, int]]
    exit_files: dict[str, tuple[int, float | None]]
    procs: dict[int, ProcStat]

    def alive(self, pid: int | None, start: int | None) -> bool:
        p = self.procs.get(pid) if pid is not None else None
        return p is not None and p.alive and start is not None and p.start == start


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class TmuxRunner:
    """Start, watch and stop commands in tmux sessions on one host."""

    def __init__(self, host: Host, store: StateStore, run_dir: str):
        if not run_dir.startswith("/"):
            raise UserError(f"run dir {run_dir!r} must be an absolute path on {host.name}")
        self.host = host
        self.store = store
        self.run_dir = run_dir.rstrip("/") or "/"

    # -- paths ----------------------------------------------------------------
    def _file(self, session: str, suffix: str) -> str:
        return f"{self.run_dir}/{session}.{suffix}"

    def log_path(self, session: str) -> str:
        """Where the log of a session's latest run is (the default one when it never ran)."""
        check_session(session)
        rec = self.store.latest_session_run(session)
        return rec.log_path if rec else self._file(session, "log")

    # -- starting -------------------------------------------------------------
    def start(
        self,
        session: str,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stage: str | None = None,
        log_path: str | None = None,
        smoke: bool = False,
        alive_timeout: float = 10.0,
    ) -> RunRecord:
        """Launch command in tmux session nd-<session>; return once it was seen alive or has exited.

        command is an argv list (quoted, no shell) or a shell command line (run by bash -c).
        Raises AlreadyRunning when the session is alive; a dead session of that name is cleaned first.
        """
        check_session(session)
        cmdline = command if isinstance(command, str) else join_argv(command)
        if not cmdline.strip():
            raise UserError("empty command")
        for what, path in (("cwd", cwd), ("log path", log_path)):
            if path is not None and not path.startswith("/"):
                raise UserError(f"{what} {path!r} must be an absolute path on {self.host.name}")
        for key in env or {}:
            if not _ENV_KEY.match(key):
                raise UserError(f"environment variable name {key!r} is not valid")
        log = log_path or self._file(session, "log")

        current = self.status(session)
        if current.running:
            raise AlreadyRunning(session, current.pid, self.host.name)

        rec = self.store.insert_run(
            session=session, command=cmdline, log_path=log, exit_path=self._file(session, "exit"),
            stage=stage, cwd=cwd, smoke=smoke,
        )
        wrapper = self._wrapper(session, command, cwd, env, log)
        wait = min(alive_timeout, 2.0)
        try:
            launched = self.host.run_script(self._launch_script(session, log, wrapper, wait), timeout=wait + 30)
        except BaseException as e:
            self._failed(rec, f"could not launch: {e}")
            raise
        if launched.returncode == 3:
            self._failed(rec, "a live session of that name appeared")
            raise AlreadyRunning(session, None, self.host.name)
        if not launched.ok:
            err = launched.stderr.decode(errors="replace").strip().splitlines()
            detail = err[-1] if err else f"exit {launched.returncode}"
            self._failed(rec, detail)
            raise HostError(f"could not start session {session} on {self.host.name}: {detail}")
        return self._await_alive(rec, alive_timeout, self._parse_view(launched.text))

    def _failed(self, rec: RunRecord, why: str) -> None:
        self.store.update_run(rec.id, state="failed", ended_at=time.time())
        self.store.add_event("run.failed", f"{rec.session}: {why}", stage=rec.stage, data={"run_id": rec.id})

    def _wrapper(self, session: str, command, cwd, env, log: str) -> str:
        q = shlex.quote
        run = join_argv(command) if not isinstance(command, str) else join_argv(["bash", "-c", command])
        body = f"cd -- {q(cwd)} && {run}" if cwd else run
        exports = "".join(f"export {k}={q(v)}\n" for k, v in (env or {}).items())
        pid_file, exit_file = self._file(session, "pid"), self._file(session, "exit")
        return (
            f"# nodedeck run of session {session}: written by nodedeck, output goes to the log below\n"
            f"{STAT_FN}\n"
            f'printf "%s %s\\n" "$$" "$(nd_stat $$)" > {q(pid_file + ".tmp")} && mv -f {q(pid_file + ".tmp")} {q(pid_file)}\n'
            # TERM/INT reach the whole group: the wrapper outlives the job to record its status.
            # HUP is not trapped: killing the tmux session ends the wrapper, and the kernel then hangs up the job.
            "trap 'nd_signal=1' TERM INT\n"
            f"echo {q(f'nodedeck: {session} running, output in {log}')}\n"
            f"{exports}"
            f"{{ {body}\n}} >> {q(log)} 2>&1 < /dev/null\n"
            "rc=$?\n"
            f'printf "%s %s\\n" "$rc" "$(date +%s.%N)" > {q(exit_file + ".tmp")} && mv -f {q(exit_file + ".tmp")} {q(exit_file)}\n'
            f'echo "nodedeck: {session} exited with status $rc"\n'
            'exit "$rc"\n'
        )

    def _launch_script(self, session: str, log: str, wrapper: str, wait: float) -> str:
        """Write the wrapper, replace a dead session, launch; wait up to `wait` s for the pid file, then probe."""
        q = shlex.quote
        name = tmux_name(session)
        sh, pid_file, exit_file = (self._file(session, x) for x in ("sh", "pid", "exit"))
        new = ["tmux", "new-session", "-d", "-s", name, "-x", "200", "-y", "50",
               "bash", sh, ";", "set-option", "-t", f"={name}:", "remain-on-exit", "on"]
        return "\n".join([
            join_argv(["mkdir", "-p", "--", self.run_dir, log.rsplit("/", 1)[0] or "/"]) + " || exit 1",
            f"if tmux has-session -t {q('=' + name)} 2>/dev/null; then",
            f"  if tmux list-panes -t {q('=' + name + ':')} -F '#{{pane_dead}}' | grep -qx 0; then exit 3; fi",
            f"  tmux kill-session -t {q('=' + name)} || exit 1",
            "fi",
            f"printf '%s' {q(wrapper)} > {q(sh + '.tmp')} && mv -f {q(sh + '.tmp')} {q(sh)} || exit 1",
            join_argv(["rm", "-f", "--", pid_file, exit_file]) + " || exit 1",
            join_argv(new) + " >/dev/null || exit 1",
            f"n=0; while [ ! -f {q(pid_file)} ] && [ ! -f {q(exit_file)} ] && [ $n -lt {int(wait / 0.02)} ]; do",
            "  sleep 0.02; n=$((n+1))",
            "done",
            self._probe_script([session], []),
        ])

    def _await_alive(self, rec: RunRecord, timeout: float, view: _NodeView) -> RunRecord:
        deadline = time.monotonic() + timeout
        pause = 0.02
        while True:
            status = self._derive(rec, view, latest=True, starting=True)
            if status.state in ("running", "exited"):
                return self._save(rec, status, view)
            if time.monotonic() >= deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.25)
            view = self._probe([rec.session], [])
        self.store.update_run(rec.id, state="lost", ended_at=time.time())
        self.store.add_event(
            "run.lost", f"{rec.session}: not seen alive within {timeout:g}s", stage=rec.stage, data={"run_id": rec.id}
        )
        raise HostError(f"session {rec.session} on {self.host.name} was not seen alive within {timeout:g}s")

    # -- looking --------------------------------------------------------------
    def _probe(self, sessions: Sequence[str], pids: Sequence[int]) -> _NodeView:
        """One round trip: tmux panes, pid/exit files of sessions, /proc identity of pids."""
        return self._parse_view(self.host.run_script(self._probe_script(sessions, pids), timeout=30).check().text)

    def _probe_script(self, sessions: Sequence[str], pids: Sequence[int]) -> str:
        lines = [
            STAT_FN,
            f"tmux list-panes -a -F {shlex.quote(_PANE_FORMAT)} 2>/dev/null",
            f"d={shlex.quote(self.run_dir)}",
            f"for p in {' '.join(str(p) for p in pids)}; do r=$(nd_stat $p) && printf 'S\\t%s\\t%s\\n' $p \"$r\"; done",
        ]
        if sessions:
            lines.append(
                f"for s in {' '.join(sessions)}; do\n"
                '  if read -r a b < "$d/$s.pid" 2>/dev/null; then printf "P\\t%s\\t%s\\t%s\\n" "$s" "$a" "$b";'
                ' r=$(nd_stat "$a") && printf "S\\t%s\\t%s\\n" "$a" "$r"; fi\n'
                '  if read -r a b < "$d/$s.exit" 2>/dev/null; then printf "E\\t%s\\t%s\\t%s\\n" "$s" "$a" "$b"; fi\n'
                "done"
            )
        lines.append("true")
        return "\n".join(lines)

    @staticmethod
    def _parse_view(out: str) -> _NodeView:
        view = _NodeView({}, {}, {}, {})
        for line in out.splitlines():
            f = line.split(":") if line.startswith("T:") else line.split("\t")
            if f[0] == "T" and len(f) == 6 and f[1].startswith(PREFIX) and f[2].isdigit():
                if f[1] not in view.panes:  # the first pane of a session is the one nodedeck made
                    view.panes[f[1]] = _Pane(int(f[2]), f[3] == "1", _int(f[4]), _int(f[5]))
            elif f[0] == "S" and len(f) == 3 and f[1].isdigit():
                stat = parse_stat_line(int(f[1]), f[2])
                if stat:
                    view.procs[stat.pid] = stat
            elif f[0] == "P" and len(f) == 4:
                rest = f[3].split()
                if f[2].isdigit() and len(rest) >= 2 and rest[0].isdigit() and rest[1].isdigit():
                    view.pid_files[f[1]] = (int(f[2]), int(rest[0]), int(rest[1]))
            elif f[0] == "E" and len(f) == 4 and _int(f[2]) is not None:
                view.exit_files[f[1]] = (int(f[2]), _float(f[3]))
        return view

    def _derive(
        self, rec: RunRecord | None, view: _NodeView, *, latest: bool, session: str | None = None, starting: bool = False
    ) -> RunStatus:
        """Combine a record with what the node showed (latest: rec is its session's newest run)."""
        session = rec.session if rec else session
        pid, start = (rec.pid, rec.proc_start) if rec else (None, None)
        pid_file = view.pid_files.get(session) if latest else None
        if pid_file and pid is not None and pid_file[0] != pid:
            pid_file = None  # the files belong to a launch this store did not make
        if pid_file and pid is None:
            pid, start = pid_file[0], pid_file[1]
        exit_file = view.exit_files.get(session) if latest and (pid_file or rec is None or rec.pid is None) else None
        pane = view.panes.get(tmux_name(session))
        if pane is not None and pid is not None and pane.pid != pid:
            pane = None
        base = dict(
            session=session, pid=pid, proc_start=start,
            log_path=rec.log_path if rec else self._file(session, "log"), started_at=rec.started_at if rec else None,
            run_id=rec.id if rec else None, stage=rec.stage if rec else None,
        )
        if exit_file is not None:
            return RunStatus(state="exited", exit_code=exit_file[0], ended_at=exit_file[1], **base)
        if view.alive(pid, start):
            return RunStatus(state="running", exit_code=None, ended_at=None, **base)
        if rec is not None and rec.state == "exited":
            return RunStatus(state="exited", exit_code=rec.exit_code, ended_at=rec.ended_at, **base)
        if pane is not None and pane.dead and pane.dead_status is not None:
            return RunStatus(state="exited", exit_code=pane.dead_status, ended_at=None,
                             detail="ended without writing its exit file", **base)
        if pane is not None and pane.dead and pane.dead_signal is not None:
            return RunStatus(state="exited", exit_code=128 + pane.dead_signal, ended_at=None,
                             detail=f"killed by signal {pane.dead_signal}", **base)
        if rec is None and pid is None:
            return RunStatus(state="missing", exit_code=None, ended_at=None, **base)
        if starting and not (pid is not None and pid in view.procs):
            return RunStatus(state="starting", exit_code=None, ended_at=None, **base)
        detail = "ended without an exit status" if pane is not None else "process gone without an exit status"
        p = view.procs.get(pid) if pid is not None else None
        if p is not None and p.start != start:
            detail = f"pid {pid} now belongs to another process (start time differs)"
        if rec is not None and rec.state == "failed":
            detail = "never started: the launch failed"
        ended = rec.ended_at if rec is not None and rec.state in ("lost", "failed") else None
        return RunStatus(state="lost", exit_code=None, ended_at=ended, detail=detail, **base)

    def _save(self, rec: RunRecord, status: RunStatus, view: _NodeView) -> RunRecord:
        """Write what a status learned into the store (and an event when the state changed)."""
        changes = {}
        if rec.pid is None and status.pid is not None:
            pf = view.pid_files.get(rec.session)
            changes.update(pid=status.pid, proc_start=status.proc_start, pgid=pf[2] if pf else status.pid)
        new_state = {"running": "running", "exited": "exited", "lost": "lost"}.get(status.state, rec.state)
        if rec.state == "failed" and new_state == "lost":
            new_state = rec.state
        if new_state != rec.state:
            changes["state"] = new_state
            if new_state == "exited":
                changes.update(exit_code=status.exit_code, ended_at=status.ended_at or time.time())
            elif new_state == "lost":
                changes["ended_at"] = time.time()
        if not changes:
            return rec
        updated = self.store.update_run(rec.id, **changes)
        if "state" in changes:
            msg = {
                "running": f"{rec.session} running (pid {updated.pid})",
                "exited": f"{rec.session} exited with status {updated.exit_code}",
                "lost": f"{rec.session} lost: {status.detail}",
            }[new_state]
            self.store.add_event(f"run.{new_state}", msg, stage=rec.stage,
                                 data={"run_id": rec.id, "session": rec.session, "exit_code": updated.exit_code})
        return updated

    def _refresh(self, recs: Sequence[RunRecord], *, sessions: Sequence[str] = ()) -> list[RunStatus]:
        """Probe the node once for recs (and untracked sessions), store what changed, return statuses."""
        latest_ids = {}
        for r in recs:
            latest = self.store.latest_session_run(r.session)
            latest_ids[r.session] = latest.id if latest else None
        names = sorted({r.session for r in recs} | set(sessions))
        view = self._probe(names, sorted({r.pid for r in recs if r.pid is not None}))
        out = []
        for r in recs:
            status = self._derive(r, view, latest=latest_ids[r.session] == r.id)
            self._save(r, status, view)
            out.append(status)
        known = {r.session for r in recs}
        out.extend(self._derive(None, view, latest=True, session=s) for s in sessions if s not in known)
        return out

    def status(self, session: str) -> RunStatus:
        """The state of a session's latest run, checked on the node now."""
        check_session(session)
        rec = self.store.latest_session_run(session)
        if rec is None:
            return self._refresh([], sessions=[session])[0]
        return self._refresh([rec])[0]

    def list(self) -> list[RunStatus]:
        """Every session this store has launched (its latest run), checked in one round trip."""
        return self._refresh(self.store.session_runs())

    def reconcile(self) -> list[RunStatus]:
        """After a restart: settle every run the store thinks is active; live ones stay running."""
        return self._refresh(self.store.active_runs())

    # -- stopping -------------------------------------------------------------
    def stop(self, session: str, grace: float = 10.0) -> StopResult:
        """SIGTERM the run's process group after checking its PID start time; SIGKILL after grace."""
        status = self.status(session)
        if status.state == "missing":
            raise UserError(f"no session {session} on {self.host.name}")
        rec = self.store.latest_session_run(session)
        if not status.running:
            self._clean_dead_session(session)
            why = {"exited": f"already exited with status {status.exit_code}", "lost": status.detail}.get(
                status.state, status.state)
            outcome = "gone" if status.state == "lost" else "not_running"
            return StopResult(session, outcome, status.pid, status.exit_code, f"{session}: {why}; nothing killed")
        pgid = rec.pgid if rec and rec.pgid else status.pid
        out = self.host.run_script(self._stop_script(session, status.pid, status.proc_start, pgid, grace),
                                   timeout=grace + 30).check().text.split()
        outcome = out[0] if out else "gone"
        if outcome not in ("terminated", "killed"):
            after = self.status(session)
            return StopResult(session, "gone", status.pid, after.exit_code,
                              f"{session}: pid {status.pid} is gone or no longer the recorded process; nothing killed")
        exit_code = _int(out[1]) if len(out) > 1 else None
        now = time.time()
        if rec is not None:
            ended = _float(out[2]) if len(out) > 2 else None
            self.store.update_run(rec.id, state="exited", exit_code=exit_code, ended_at=ended or now, stopped_at=now)
            self.store.add_event("run.stopped", f"{session} stopped ({outcome}, status {exit_code})", stage=rec.stage,
                                 data={"run_id": rec.id, "session": session, "outcome": outcome, "exit_code": exit_code})
        how = "ended after SIGTERM" if outcome == "terminated" else f"did not end within {grace:g}s of SIGTERM: killed"
        return StopResult(session, outcome, status.pid, exit_code, f"{session}: {how}")

    def _stop_script(self, session: str, pid: int, start: int, pgid: int, grace: float) -> str:
        q = shlex.quote
        name, window = q("=" + tmux_name(session)), q("=" + tmux_name(session) + ":")
        exit_file = self._file(session, "exit")
        return "\n".join([
            STAT_FN,
            GROUP_ALIVE_FN,
            f"set -- $(nd_stat {pid})",
            f'if [ "$1" != {start} ] || [ "$3" = Z ]; then echo gone; exit 0; fi',
            f'if [ "$2" != {pgid} ]; then echo gone; exit 0; fi',
            f"kill -TERM -- -{pgid} 2>/dev/null",
            "outcome=terminated",
            f"end=$(( $(date +%s%N) + {int(grace * 1e9)} ))",
            f"while nd_group_alive {pgid}; do",
            f'  if [ "$(date +%s%N)" -ge "$end" ]; then kill -KILL -- -{pgid} 2>/dev/null; outcome=killed; break; fi',
            "  sleep 0.05",
            "done",
            'if [ "$outcome" = killed ]; then',
            f"  n=0; while nd_group_alive {pgid} && [ $n -lt 100 ]; do sleep 0.05; n=$((n+1)); done",
            "fi",
            f"pane=$(tmux list-panes -t {window} -F '#{{pane_pid}} #{{pane_dead}}' 2>/dev/null | head -n 1)",
            f'case "$pane" in "{pid} "*|*" 1") tmux kill-session -t {name} 2>/dev/null ;; esac',
            f"if [ ! -f {q(exit_file)} ]; then",
            '  if [ "$outcome" = killed ]; then code=137; else code=143; fi',
            f'  printf "%s %s\\n" "$code" "$(date +%s.%N)" > {q(exit_file + ".tmp")} && mv -f {q(exit_file + ".tmp")} {q(exit_file)}',
            "fi",
            f'read -r code ended < {q(exit_file)}',
            'echo "$outcome $code $ended"',
        ])

    def _clean_dead_session(self, session: str) -> None:
        """Remove the tmux session of a finished run, only when its pane is dead."""
        name, window = shlex.quote("=" + tmux_name(session)), shlex.quote("=" + tmux_name(session) + ":")
        self.host.run_script(
            f"if tmux list-panes -t {window} -F '#{{pane_dead}}' 2>/dev/null | grep -qx 1; then tmux kill-session -t {name}; fi; true"
        )

    # -- logs -----------------------------------------------------------------
    def tail(self, session: str, lines: int = 200) -> str:
        """The last lines of the session's log ('' when there is no log yet)."""
        path = self.log_path(session)
        res = self.host.run(["tail", "-n", str(int(lines)), "--", path], timeout=30)
        if not res.ok:
            if self.host.stat(path) is None:
                return ""
            res.check()
        return res.text

    def follow(self, session: str, *, lines: int | None = 0, poll: float = 0.5) -> Iterator[str]:
        """Yield the session's log as it grows until its run is no longer running.

        Starts with the last `lines` lines (0: only what is appended from now on,
        None: the whole log), read in the same round trip that fixes the offset.
        """
        path = self.log_path(session)
        q = shlex.quote(path)
        script = f's=$(stat -c %s -- {q} 2>/dev/null || echo 0); echo "$s"'
        if lines is None:
            script += f'; head -c "$s" -- {q} 2>/dev/null'
        elif lines > 0:
            script += f'; head -c "$s" -- {q} 2>/dev/null | tail -n {int(lines)}'
        first = self.host.run_script(script + "; true").check().stdout
        size, _, start_text = first.partition(b"\n")
        offset = int(size or 0)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        if start_text:
            yield decoder.decode(start_text)
        while True:
            running = self.status(session).running
            st = self.host.stat(path)
            if st is not None and st.size < offset:
                offset = 0  # truncated or replaced
            while st is not None and st.size > offset:
                chunk = self.host.read_range(path, offset, min(st.size - offset, 1 << 20))
                if not chunk:
                    break
                offset += len(chunk)
                text = decoder.decode(chunk)
                if text:
                    yield text
            if not running:
                rest = decoder.decode(b"", final=True)
                if rest:
                    yield rest
                return
            time.sleep(poll)

"""TmuxRunner: start, watch and stop commands in tmux sessions on one host, recorded in a StateStore."""

from __future__ import annotations

import builtins
import codecs
import re
import time
from typing import Any, Iterator, Sequence

from ops import nodenum
from ops.errors import HostError, UserError
from ops.hosts.base import Host, join_argv
from ops.state import RunRecord, StateStore
from ops.textsafe import last_line
from ops.tmux.scripts import (
    RunFiles,
    clean_dead_script,
    launch_script,
    log_start_script,
    probe_script,
    stop_script,
    wrapper_script,
)
from ops.tmux.sessions import (
    SERVER,
    AlreadyRunning,
    RunStatus,
    StopResult,
    check_session,
    tmux_name,
)
from ops.tmux.view import NodeView, derive, parse_stop_output, parse_view

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SETTLE_TRIES = 8   # looks at one run made again after another process settled it first
_EVENT_TEXT = {"running": "{s} running (pid {pid})", "exited": "{s} exited with status {code}",
               "lost": "{s} lost: {detail}"}


class TmuxRunner:
    """Start, watch and stop commands in tmux sessions on one host."""

    def __init__(self, host: Host, store: StateStore, run_dir: str):
        if not run_dir.startswith("/"):
            raise UserError(f"run dir {run_dir!r} must be an absolute path on {host.name}")
        self.host = host
        self.store = store
        self.run_dir = run_dir.rstrip("/") or "/"

    def _files(self, tmux_session: str, rec: RunRecord | None = None) -> RunFiles:
        """A session's files: where its run rec wrote them (a runner of another workspace on this node, whose
        state file is shared, may have launched it), else in this runner's run dir."""
        if rec is not None:
            where, _, name = rec.exit_path.rpartition("/")
            if name == f"{tmux_session}.exit" and where.startswith("/"):
                return RunFiles(where, tmux_session)
        return RunFiles(self.run_dir, tmux_session)

    def _latest_files(self, tmux_session: str) -> RunFiles:
        """The files of the session's latest run (this runner's run dir when it has none)."""
        return self._files(tmux_session, self.store.latest_tmux_session_run(check_session(tmux_session)))

    def env_path(self, tmux_session: str) -> str | None:
        """The PATH the session's latest command ran with, as its wrapper recorded it (None: not yet)."""
        res = self.host.run(["cat", "--", self._latest_files(tmux_session).env_path], timeout=30)
        return res.text.rstrip("\n") if res.ok and res.text.strip() else None

    def log_path(self, tmux_session: str) -> str:
        """Where the log of a session's latest run is (the default one when it never ran)."""
        check_session(tmux_session)
        rec = self.store.latest_tmux_session_run(tmux_session)
        return rec.log_path if rec else self._files(tmux_session).default_log

    def progress_path(self, tmux_session: str) -> str:
        """Where a session's runs write progress records: given to each run as `$NODEDECK_PROGRESS`."""
        return self._latest_files(tmux_session).progress

    # -- starting -------------------------------------------------------------
    def start(
        self,
        tmux_session: str,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        run_key: str | None = None,
        log_path: str | None = None,
        smoke: bool = False,
        alive_timeout: float = 10.0,
        setup: Sequence[str] = (),
    ) -> RunRecord:
        """Start command in tmux session nd-<session>; return once it was seen alive or has exited.

        command is an argv list (quoted, no shell) or a shell command line (run by bash -c); setup lines
        run before it in the wrapper's shell (so `source venv/bin/activate` reaches it).
        Raises AlreadyRunning when the session is alive; a dead session of that name is cleaned first.
        """
        check_session(tmux_session)
        cmdline = command if isinstance(command, str) else join_argv(command)
        if not cmdline.strip():
            raise UserError("empty command")
        for what, path in (("cwd", cwd), ("log path", log_path)):
            if path is not None and not path.startswith("/"):
                raise UserError(f"{what} {path!r} must be an absolute path on {self.host.name}")
        for key in env or {}:
            if not _ENV_KEY.match(key):
                raise UserError(f"environment variable name {key!r} is not valid")
        files = self._files(tmux_session)
        log = log_path or files.default_log

        current = self.status(tmux_session)
        if current.running:
            raise AlreadyRunning(tmux_session, current.pid, self.host.name)

        rec = self.store.insert_run(tmux_session=tmux_session, command=cmdline, log_path=log, exit_path=files.exit,
                                    run_key=run_key, cwd=cwd, smoke=smoke)
        wait = min(alive_timeout, 2.0)
        env = {"NODEDECK_PROGRESS": files.progress, **(env or {})}
        script = launch_script(files, log, wrapper_script(files, command, cwd, env, log, setup), wait)
        try:
            launched = self.host.run_script(script, timeout=wait + 30)
        except BaseException as e:
            self._failed(rec, f"could not launch: {e}")
            raise
        if launched.returncode == 3:   # another process launched it first: this run never was
            self.store.delete_run(rec.id)
            self.store.add_event("run.refused", f"{tmux_session}: a live session of that name appeared; not launched",
                                 run_key=run_key)
            raise AlreadyRunning(tmux_session, None, self.host.name)
        if not launched.ok:
            detail = last_line(launched.stderr) or f"exit {launched.returncode}"   # the node's words, bounded
            self._failed(rec, detail)
            raise HostError(f"could not start session {tmux_session} on {self.host.name}: {detail}")
        return self._await_alive(rec, alive_timeout, parse_view(launched.text))

    def _failed(self, rec: RunRecord, why: str) -> None:
        self.store.update_run(rec.id, state="failed", ended_at=time.time())
        self.store.add_event("run.failed", f"{rec.tmux_session}: {why}", run_key=rec.stage, data={"run_id": rec.id})

    def _await_alive(self, rec: RunRecord, timeout: float, view: NodeView) -> RunRecord:
        deadline = time.monotonic() + timeout
        pause = 0.02
        while True:
            rec, status = self._settle(rec, view, latest=True)
            if status.state in ("running", "exited"):
                return rec
            if time.monotonic() >= deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.25)
            view = self._probe([self._files(rec.tmux_session, rec)], [])
        if self.store.settle_run(rec.id, rec.state, state="lost", ended_at=time.time()) is not None:
            self.store.add_event("run.lost", f"{rec.tmux_session}: not seen alive within {timeout:g}s",
                                 run_key=rec.stage, data={"run_id": rec.id})
        else:   # another process settled it meanwhile
            rec = self.store.get_run(rec.id)
            if rec.state in ("running", "exited"):
                return rec
        raise HostError(f"session {rec.tmux_session} on {self.host.name} was not seen alive within {timeout:g}s")

    # -- looking --------------------------------------------------------------
    def _probe(self, sessions: Sequence[RunFiles], pids: Sequence[int]) -> NodeView:
        """One round trip: tmux panes, pid/exit files of sessions, /proc identity of pids."""
        script = probe_script(sessions, pids)
        return parse_view(self.host.run_script(script, timeout=30).check().text)

    def _settle(self, rec: RunRecord, view: NodeView, *, latest: bool) -> tuple[RunRecord, RunStatus]:
        """What view says of rec, written into the store (an event when its state changed): the record as
        stored and the status. A process sharing the state file that settled the run after rec was read
        has its word: the look is made again from its record (a few times at most: states move on)."""
        for _ in range(_SETTLE_TRIES):
            status = derive(rec, view, latest=latest)
            changes: dict[str, Any] = {}
            if rec.pid is None and status.pid is not None:
                pid_file = view.pid_files.get(rec.tmux_session)
                changes.update(pid=status.pid, proc_start=status.proc_start,
                               pgid=pid_file[2] if pid_file else status.pid)
            new_state = status.state if status.state in ("running", "exited", "lost") else rec.state
            if rec.state == "failed" and new_state == "lost":
                new_state = rec.state
            if new_state != rec.state:
                changes["state"] = new_state
                if new_state == "exited":
                    changes.update(exit_code=status.exit_code, ended_at=status.ended_at or time.time())
                elif new_state == "lost":
                    changes["ended_at"] = time.time()
            if not changes:
                return rec, status
            updated = self.store.settle_run(rec.id, rec.state, **changes)
            if updated is None:
                rec = self.store.get_run(rec.id)
                continue
            if "state" in changes:
                text = _EVENT_TEXT[new_state].format(s=rec.tmux_session, pid=updated.pid, code=updated.exit_code,
                                                     detail=status.detail)
                self.store.add_event(f"run.{new_state}", text, run_key=rec.stage,
                                     data={"run_id": rec.id, "session": rec.tmux_session,
                                           "exit_code": updated.exit_code})
            return updated, status
        return rec, derive(rec, view, latest=latest)

    def _refresh(self, recs: Sequence[RunRecord], *, tmux_sessions: Sequence[str] = ()) -> list[RunStatus]:
        """Probe the node once for recs (and untracked sessions), store what changed, return statuses."""
        names = sorted({r.tmux_session for r in recs} | set(tmux_sessions))
        latest = {s: self.store.latest_tmux_session_run(s) for s in names}
        pids = sorted({r.pid for r in recs if r.pid is not None})
        view = self._probe([self._files(s, latest[s]) for s in names], pids)
        out = []
        for r in recs:
            newest = latest[r.tmux_session]
            out.append(self._settle(r, view, latest=newest is not None and newest.id == r.id)[1])
        known = {r.tmux_session for r in recs}
        out.extend(derive(None, view, latest=True, tmux_session=s, default_log=self._files(s).default_log)
                   for s in tmux_sessions if s not in known)
        return out

    def status(self, tmux_session: str) -> RunStatus:
        """The state of a session's latest run, checked on the node now."""
        check_session(tmux_session)
        rec = self.store.latest_tmux_session_run(tmux_session)
        if rec is None:
            return self._refresh([], tmux_sessions=[tmux_session])[0]
        return self._refresh([rec])[0]

    def foreign_pid(self, tmux_session: str) -> int | None:
        """The pid of a live process in tmux session nd-<session> that is not the session's recorded
        run (something nodedeck did not start there), else None. Nothing of nodedeck's touches it."""
        check_session(tmux_session)
        pane = self._probe([], []).panes.get(tmux_name(tmux_session))
        if pane is None or pane.dead:
            return None
        status = self.status(tmux_session)
        return None if status.running and status.pid == pane.pid else pane.pid

    def server(self, tmux_session: str) -> str:
        """The tmux server the session is in: nodedeck's own (ops.tmux.sessions.SERVER), or the node's default one
        for a run an older nodedeck launched there (LEGACY_SERVER); SERVER when neither has it."""
        pane = self._probe([], []).panes.get(tmux_name(check_session(tmux_session)))
        return pane.server if pane is not None else SERVER

    def list(self) -> list[RunStatus]:
        """Every session this store has launched (its latest run), checked in one round trip."""
        return self._refresh(self.store.tmux_session_runs())

    def reconcile(self) -> builtins.list[RunStatus]:   # `list` here is the method above
        """After a restart: settle every run the store thinks is active; live ones stay running."""
        return self._refresh(self.store.active_runs())

    # -- stopping -------------------------------------------------------------
    def stop(self, tmux_session: str, grace: float = 10.0) -> StopResult:
        """SIGTERM the run's process group after checking its PID start time; SIGKILL after grace."""
        status = self.status(tmux_session)
        if status.state == "missing":
            raise UserError(f"no session {tmux_session} on {self.host.name}")
        if not status.running:
            self.host.run_script(clean_dead_script(tmux_session))
            why = f"already exited with status {status.exit_code}" if status.state == "exited" else (
                status.detail or status.state)
            outcome = "gone" if status.state == "lost" else "not_running"
            return StopResult(tmux_session, outcome, status.pid, status.exit_code,
                              f"{tmux_session}: {why}; nothing killed")
        if status.pid is None or status.proc_start is None:
            raise HostError(f"{tmux_session}: running, but its pid was never recorded; nothing killed")
        rec = self.store.latest_tmux_session_run(tmux_session)
        pgid = rec.pgid if rec is not None and rec.pgid else status.pid
        script = stop_script(self._files(tmux_session, rec), status.pid, status.proc_start, pgid, grace)
        outcome, exit_code, ended = parse_stop_output(self.host.run_script(script, timeout=grace + 30).check().text)
        if outcome not in ("terminated", "killed"):
            after = self.status(tmux_session)
            return StopResult(tmux_session, "gone", status.pid, after.exit_code,
                              f"{tmux_session}: pid {status.pid} is gone or no longer the recorded process; "
                              "nothing killed")
        now = time.time()
        if rec is not None:
            self.store.update_run(rec.id, state="exited", exit_code=exit_code, ended_at=ended or now, stopped_at=now)
            self.store.add_event("run.stopped", f"{tmux_session} stopped ({outcome}, status {exit_code})",
                                 run_key=rec.stage, data={"run_id": rec.id, "session": tmux_session, "outcome": outcome,
                                                        "exit_code": exit_code})
        how = "ended after SIGTERM" if outcome == "terminated" else f"did not end within {grace:g}s of SIGTERM: killed"
        return StopResult(tmux_session, outcome, status.pid, exit_code, f"{tmux_session}: {how}")

    def clean(self, tmux_session: str) -> None:
        """Remove the session's tmux session when its pane is dead (its run is over and recorded)."""
        self.host.run_script(clean_dead_script(check_session(tmux_session)), timeout=30)

    # -- logs -----------------------------------------------------------------
    def tail(self, tmux_session: str, lines: int = 200) -> str:
        """The last lines of the session's log ('' when there is no log yet)."""
        path = self.log_path(tmux_session)
        res = self.host.run(["tail", "-n", str(int(lines)), "--", path], timeout=30)
        if not res.ok:
            if self.host.stat(path) is None:
                return ""
            res.check()
        return res.text

    def follow(self, tmux_session: str, *, lines: int | None = 0, poll: float = 0.5) -> Iterator[str]:
        """Yield the session's log as it grows until its run is no longer running.

        Starts with the last `lines` lines (0: only what is appended from now on,
        None: the whole log), read in the same round trip that fixes the offset.
        """
        path = self.log_path(tmux_session)
        first = self.host.run_script(log_start_script(path, lines)).check().stdout
        size, _, start_text = first.partition(b"\n")
        try:
            offset = nodenum.BYTES.named("log size").parse(size) if size else 0
        except nodenum.Invalid as e:
            raise HostError(f"{self.host.name}: {path}: {e}") from None
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        if start_text:
            yield decoder.decode(start_text)
        while True:
            running = self.status(tmux_session).running
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

"""The bash sent to the node: the run wrapper and the launch, probe and stop scripts.

Every value is quoted with shlex; session names are validated before they get here.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Sequence

from ops.hosts.base import join_argv
from ops.procs import GROUP_ALIVE_FN, STAT_FN
from ops.tmux.sessions import LEGACY_SERVER, SERVER, progress_path, tmux_name

q = shlex.quote

TMUX = f"tmux -L {SERVER}"
"""tmux as every script runs it: in nodedeck's own server on the node (ops.tmux.sessions.SERVER)."""
OLD_TMUX = f"tmux -L {LEGACY_SERVER}"
"""The server stages of older versions may still run in (looked at, never launched in)."""
NEW_SESSION_TRIES = 40
"""How often a launch asks tmux for the new session while the server it reaches is exiting (0.05 s apart)."""
NO_OUTER = "unset TMUX TMUX_PANE"
"""First line of every script: no tmux of the caller's terminal reaches tmux or a stage's environment."""

# ':' separates: tmux never puts one in a session name, and it prints a tab as '_' to a non-UTF-8 client.
PANE_FORMAT = "T:#{session_name}:#{pane_pid}:#{pane_dead}:#{pane_dead_status}:#{pane_dead_signal}"


@dataclass(frozen=True)
class RunFiles:
    """A session's files in the run dir on the node."""

    run_dir: str
    tmux_session: str

    @property
    def stem(self) -> str:
        """Every file of the session is this path and a suffix."""
        return f"{self.run_dir}/{self.tmux_session}"

    def _path(self, suffix: str) -> str:
        return f"{self.stem}.{suffix}"

    @property
    def script(self) -> str:
        return self._path("sh")

    @property
    def pid(self) -> str:
        return self._path("pid")

    @property
    def exit(self) -> str:
        return self._path("exit")

    @property
    def env_path(self) -> str:
        """The PATH the command ran with (after env and setup), one line."""
        return self._path("path")

    @property
    def default_log(self) -> str:
        return self._path("log")

    @property
    def progress(self) -> str:
        """Where the run writes its progress records (`$NODEDECK_PROGRESS`; ops.tmux.sessions.progress_path)."""
        return progress_path(self.run_dir, tmux_name(self.tmux_session))


def _atomic_printf(fmt_args: str, path: str) -> str:
    """printf into path through a temp file and a rename, so readers never see half a line."""
    return f"printf {fmt_args} > {q(path + '.tmp')} && mv -f {q(path + '.tmp')} {q(path)}"


def wrapper_script(files: RunFiles, command: str | Sequence[str], cwd: str | None, env: dict[str, str] | None,
                   log: str, setup: Sequence[str] = ()) -> str:
    """The pane's program: record own identity, set env and run the setup lines (into the log; the first
    that fails ends the run with its status), record the PATH the command gets, run the command into the
    log, record its exit status."""
    run = join_argv(["bash", "-c", command]) if isinstance(command, str) else join_argv(command)
    body = f"printf '%s\\n' \"$PATH\" > {q(files.env_path)}; " + (f"cd -- {q(cwd)} && {run}" if cwd else run)
    for line in reversed(setup):   # in this shell, not a subshell: `source .../activate` reaches the command
        body = f"{{ {line}\n}} && {{ {body}; }}"
    exports = "".join(f"export {k}={q(v)}\n" for k, v in (env or {}).items())
    return (
        f"# nodedeck run of session {files.tmux_session}: written by nodedeck, output goes to the log below\n"
        f"{STAT_FN}\n"
        + _atomic_printf('"%s %s\\n" "$$" "$(nd_stat $$)"', files.pid) + "\n"
        # TERM/INT reach the whole group: the wrapper outlives the job to record its status.
        # HUP is not trapped: killing the tmux session ends the wrapper, and the kernel then hangs up the job.
        "trap 'nd_signal=1' TERM INT\n"
        f"echo {q(f'nodedeck: {files.tmux_session} running, output in {log}')}\n"
        f"{exports}"
        f"{{ {body}\n}} >> {q(log)} 2>&1 < /dev/null\n"
        "rc=$?\n"
        + _atomic_printf('"%s %s\\n" "$rc" "$(date +%s.%N)"', files.exit) + "\n"
        f'echo "nodedeck: {files.tmux_session} exited with status $rc"\n'
        'exit "$rc"\n'
    )


def launch_script(files: RunFiles, log: str, wrapper: str, wait: float) -> str:
    """Write the wrapper, replace a dead session, launch; wait up to `wait` s for the pid file, then probe.

    Exits 3 (launching nothing) when a live session of that name exists.
    """
    name = tmux_name(files.tmux_session)
    new = ["tmux", "-L", SERVER, "new-session", "-d", "-s", name, "-x", "200", "-y", "50", "bash", files.script,
           ";", "set-option", "-t", f"={name}:", "remain-on-exit", "on"]
    return "\n".join([
        NO_OUTER,
        join_argv(["mkdir", "-p", "--", files.run_dir, log.rsplit("/", 1)[0] or "/"]) + " || exit 1",
        f"if {OLD_TMUX} list-panes -t {q('=' + name + ':')} -F '#{{pane_dead}}' 2>/dev/null | grep -qx 0; then",
        "  exit 3",   # alive in the server an older nodedeck launched it in
        "fi",
        f"if {TMUX} has-session -t {q('=' + name)} 2>/dev/null; then",
        f"  if {TMUX} list-panes -t {q('=' + name + ':')} -F '#{{pane_dead}}' | grep -qx 0; then exit 3; fi",
        f"  {TMUX} kill-session -t {q('=' + name)} || exit 1",
        "fi",
        _atomic_printf(f"'%s' {q(wrapper)}", files.script) + " || exit 1",
        join_argv(["rm", "-f", "--", files.pid, files.exit, files.env_path, files.progress]) + " || exit 1",
        # A server whose last session was just killed (above, or by a stop a moment ago) may take this client's
        # connection and then exit: tmux says "server exited unexpectedly". A new server is started by trying again.
        f"t=0; until e=$({join_argv(new)} 2>&1 >/dev/null); do",
        f'  t=$((t+1)); case $e in *"server exited"*) [ $t -lt {NEW_SESSION_TRIES} ] && {{ sleep 0.05; continue; }};;',
        "  esac",
        "  printf '%s\\n' \"$e\" >&2; exit 1",
        "done",
        f"n=0; while [ ! -f {q(files.pid)} ] && [ ! -f {q(files.exit)} ] && [ $n -lt {int(wait / 0.02)} ]; do",
        "  sleep 0.02; n=$((n+1))",
        "done",
        probe_script([files], []),
    ])


def probe_script(sessions: Sequence[RunFiles], pids: Sequence[int]) -> str:
    """Print every tmux pane (T:; O: in the legacy server), the pid (P) and exit (E) files of sessions (each
    in its own run dir: workspaces on one node share its state), /proc identity (S) of pids."""
    lines = [
        NO_OUTER,
        STAT_FN,
        f"{TMUX} list-panes -a -F {q(PANE_FORMAT)} 2>/dev/null",
        f"{OLD_TMUX} list-panes -a -F {q('O' + PANE_FORMAT[1:])} 2>/dev/null",
        f"for p in {' '.join(str(int(p)) for p in pids)}; "
        "do r=$(nd_stat $p) && printf 'S\\t%s\\t%s\\n' $p \"$r\"; done",
    ]
    if sessions:
        lines.append(
            f"for f in {' '.join(q(f.stem) for f in sessions)}; do\n"
            '  s=${f##*/}\n'
            '  if read -r a b < "$f.pid" 2>/dev/null; then printf "P\\t%s\\t%s\\t%s\\n" "$s" "$a" "$b";'
            ' r=$(nd_stat "$a") && printf "S\\t%s\\t%s\\n" "$a" "$r"; fi\n'
            '  if read -r a b < "$f.exit" 2>/dev/null; then printf "E\\t%s\\t%s\\t%s\\n" "$s" "$a" "$b"; fi\n'
            "done"
        )
    lines.append("true")
    return "\n".join(lines)


def stop_script(files: RunFiles, pid: int, start: int, pgid: int, grace: float) -> str:
    """Check identity, SIGTERM the group, wait `grace`, SIGKILL; remove the session; print "OUTCOME CODE ENDED".

    Prints just "gone" and signals nothing when pid no longer has start time `start` and group `pgid`.
    """
    name, window = q("=" + tmux_name(files.tmux_session)), q("=" + tmux_name(files.tmux_session) + ":")
    pid, start, pgid = int(pid), int(start), int(pgid)
    return "\n".join([
        NO_OUTER,
        STAT_FN,
        GROUP_ALIVE_FN,
        f"set -- $(nd_stat {pid})",
        f'if [ "$1" != {start} ] || [ "$2" != {pgid} ] || [ "$3" = Z ]; then echo gone; exit 0; fi',
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
        f"for t in {q(TMUX)} {q(OLD_TMUX)}; do",
        f"  pane=$($t list-panes -t {window} -F '#{{pane_pid}} #{{pane_dead}}' 2>/dev/null | head -n 1)",
        f'  case "$pane" in "{pid} "*|*" 1") $t kill-session -t {name} 2>/dev/null ;; esac',
        "done",
        f"if [ ! -f {q(files.exit)} ]; then",
        '  if [ "$outcome" = killed ]; then code=137; else code=143; fi',
        "  " + _atomic_printf('"%s %s\\n" "$code" "$(date +%s.%N)"', files.exit),
        "fi",
        f"read -r code ended < {q(files.exit)}",
        'echo "$outcome $code $ended"',
    ])


def clean_dead_script(tmux_session: str) -> str:
    """Remove a session's tmux session only when its pane is dead."""
    name, window = q("=" + tmux_name(tmux_session)), q("=" + tmux_name(tmux_session) + ":")
    return (f"{NO_OUTER}; for t in {q(TMUX)} {q(OLD_TMUX)}; do "
            f"if $t list-panes -t {window} -F '#{{pane_dead}}' 2>/dev/null | grep -qx 1; "
            f"then $t kill-session -t {name}; fi; done; true")


def log_start_script(path: str, lines: int | None) -> str:
    """Print the log's size, then its last `lines` lines (None: all of it) up to that size."""
    script = f's=$(stat -c %s -- {q(path)} 2>/dev/null || echo 0); echo "$s"'
    if lines is None:
        script += f'; head -c "$s" -- {q(path)} 2>/dev/null'
    elif lines > 0:
        script += f'; head -c "$s" -- {q(path)} 2>/dev/null | tail -n {int(lines)}'
    return script + "; true"

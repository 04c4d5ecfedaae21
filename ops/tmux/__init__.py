"""Run stage commands in tmux sessions on a node, and know for sure whether they live.

Each run is a tmux session `nd-<session>` in nodedeck's own tmux server on the node (`tmux -L nodedeck`,
whatever $TMUX the caller has; sessions.SERVER), whose pane runs a wrapper script
(`<run_dir>/<session>.sh`). The wrapper first writes its own PID and start time
to `<session>.pid`, runs the command with output appended to the log, then
writes the exit status to `<session>.exit` (temp file + rename). A run counts
as running only while that PID exists with that start time; it is stopped by
signalling its recorded process group after the same check, never by name.
Everything goes through Host.run / run_script, so a LocalHost and an SSHHost
behave the same; every refresh is one round trip however many sessions it covers.

sessions.py holds session names and result types, scripts.py the shell sent to the node,
view.py what a probe saw and what it means, runner.py the TmuxRunner.
"""

from ops.tmux.runner import TmuxRunner
from ops.tmux.sessions import (
    PREFIX,
    SERVER,
    AlreadyRunning,
    RunStatus,
    StopResult,
    check_session,
    tmux_name,
)

__all__ = ["PREFIX", "SERVER", "AlreadyRunning", "RunStatus", "StopResult", "TmuxRunner", "check_session", "tmux_name"]

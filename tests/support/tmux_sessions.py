"""Kill the tmux sessions a test's plan left, by plan name (session names also carry a workspace hash)."""

from __future__ import annotations

import subprocess

from ops.plan.resolve import session_name
from ops.tmux import SERVER, tmux_name

TMUX = ("tmux", "-L", SERVER)
"""tmux as nodedeck runs it: the server every stage lives in (the tests' own, under their $TMUX_TMPDIR)."""


def kill_plan_sessions(plan_name: str, stage_ids=None) -> None:
    """Kill every `nd-<plan>-<stage>-*` session of the test tmux server (all stages when stage_ids is None)."""
    res = subprocess.run([*TMUX, "list-sessions", "-F", "#{session_name}"], capture_output=True, text=True)
    prefixes = [tmux_name(session_name(plan_name, s)) for s in stage_ids] if stage_ids else [tmux_name(plan_name + "-")]
    for name in res.stdout.split():
        if any(name.startswith(p) for p in prefixes):
            subprocess.run([*TMUX, "kill-session", "-t", f"={name}"], capture_output=True)

"""A real terminal for a test: one pane of a tmux server of the test's own (its socket under the run's
TMUX_TMPDIR), 200x50, running a command; what it shows is read with capture-pane, keys go in with send-keys
(several keys of one call arrive together, as a fast typist's or tmux's escape-time would deliver them)."""

from __future__ import annotations

import subprocess
import time
import uuid


class Terminal:
    def __init__(self, command: str):
        self.tmux = ["tmux", "-L", f"nd-term-{uuid.uuid4().hex[:8]}"]
        subprocess.run([*self.tmux, "-f", "/dev/null", "new-session", "-d", "-x", "200", "-y", "50", command],
                       check=True)

    def text(self) -> str:
        res = subprocess.run([*self.tmux, "capture-pane", "-p", "-J", "-S", "-200"], capture_output=True, text=True)
        return res.stdout

    def wait(self, what: str, timeout: float = 60) -> str:
        """The pane's text once `what` is in it (fails after timeout, showing the pane)."""
        deadline = time.monotonic() + timeout
        while what not in (text := self.text()):
            assert time.monotonic() < deadline, f"{what!r} never shown:\n{text}"
            time.sleep(0.2)
        return text

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", *keys], check=True)

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)

"""`on_alert` hooks: a node's command run on this machine for each new alert, never holding up a poll.

`HookRunner.start(command, alert)` returns at once. The command runs (`bash -c`) in its own process
group under a small supervisor process (plain Python, no nodedeck import) that kills the whole group
past the timeout, so a hanging hook is stopped even after nodedeck has exited. The alert is in the
environment (NODEDECK_ALERT_NODE, _KIND, _SEVERITY, _MESSAGE, _EVIDENCE) and as JSON on stdin. Node
text may hold anything: in the environment, NUL, control, bidi and surrogate characters are written
as `\\xNN` / `\\uNNNN` escapes (a NUL cannot be passed at all); the JSON escapes them itself.
`reports()` gives the hooks that failed (could not start, exited non-zero, ran past the timeout).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque

from ops.alerts.records import Alert

TIMEOUT_S = 30.0
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
_SUPERVISOR = r"""
import json, os, signal, subprocess, sys
timeout, command = float(sys.argv[1]), sys.argv[2]
data = sys.stdin.buffer.read()
try:
    p = subprocess.Popen(["bash", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, start_new_session=True)
except OSError as e:
    res = {"error": str(e)}
else:
    try:
        _, err = p.communicate(data, timeout=timeout)
        res = {"rc": p.returncode, "stderr": err[-4096:].decode(errors="replace")}
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        res = {"timeout": True}
try:
    print(json.dumps(res), flush=True)
except (BrokenPipeError, OSError):
    pass
"""


def env_text(text: str) -> str:
    """`text` fit for an environment variable and safe to echo: unsafe characters as visible escapes."""
    def esc(m: re.Match) -> str:
        c = ord(m.group())
        return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"

    return _UNSAFE.sub(esc, text)


def alert_env(alert: Alert) -> dict[str, str]:
    return {"NODEDECK_ALERT_NODE": env_text(alert.node), "NODEDECK_ALERT_KIND": env_text(alert.kind.value),
            "NODEDECK_ALERT_SEVERITY": env_text(alert.severity.value),
            "NODEDECK_ALERT_MESSAGE": env_text(alert.message), "NODEDECK_ALERT_EVIDENCE": env_text(alert.evidence)}


def _one_line(text: str) -> str:
    return env_text(text.strip().splitlines()[-1]) if text.strip() else ""


class HookRunner:
    """Runs `on_alert` commands in the background; thread-safe."""

    def __init__(self, timeout: float = TIMEOUT_S):
        self.timeout = timeout
        self._lock = threading.Lock()
        self._running: dict[threading.Thread, tuple[str, float]] = {}   # -> (alert key, started)
        self._reports: deque[str] = deque(maxlen=50)

    def start(self, command: str, alert: Alert) -> str | None:
        """Start the hook for `alert`; returns an error line when it could not start (nothing runs then)."""
        try:
            proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _SUPERVISOR, f"{self.timeout:g}", command],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    env={**os.environ, **alert_env(alert)}, start_new_session=True)
        except (OSError, ValueError) as e:                # ValueError: a NUL in the command itself
            return f"on_alert for {env_text(alert.key)} could not run: {env_text(str(e))}"
        th = threading.Thread(target=self._wait, args=(proc, alert), name="on_alert", daemon=True)
        with self._lock:
            self._running[th] = (alert.key, time.monotonic())
        th.start()
        return None

    def _wait(self, proc: subprocess.Popen, alert: Alert) -> None:
        key = env_text(alert.key)
        try:
            out, _ = proc.communicate(json.dumps(alert.to_json()).encode())
            res = json.loads(out.decode(errors="replace") or "{}")
        except (OSError, ValueError) as e:
            res = {"error": f"supervisor failed: {e}"}
        if "error" in res:
            report = f"on_alert for {key} could not run: {env_text(str(res['error']))}"
        elif res.get("timeout"):
            report = f"on_alert for {key} ran past {self.timeout:g}s and was stopped"
        elif res.get("rc") != 0:
            tail = _one_line(str(res.get("stderr", "")))
            report = f"on_alert for {key} exited {res.get('rc')}" + (f": {tail}" if tail else "")
        else:
            report = ""
        with self._lock:
            self._running.pop(threading.current_thread(), None)
            if report:
                self._reports.append(report)

    def reports(self) -> list[str]:
        """The failures of the hooks that ended since the last call."""
        with self._lock:
            out = list(self._reports)
            self._reports.clear()
            return out

    def running(self) -> list[str]:
        """The alert keys whose hooks still run."""
        with self._lock:
            return [env_text(key) for key, _ in self._running.values()]

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` for the running hooks to end; True when none runs any more."""
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._running)
        for th in threads:
            th.join(max(0.0, deadline - time.monotonic()))
        return not self.running()


def run_on_alert(command: str, alert: Alert, *, timeout: float = TIMEOUT_S) -> str | None:
    """Run one hook to its end (at most `timeout`, then its whole process group is killed);
    returns its error line, or None."""
    runner = HookRunner(timeout)
    err = runner.start(command, alert)
    if err:
        return err
    runner.wait(timeout + 30.0)
    return next(iter(runner.reports()), None)

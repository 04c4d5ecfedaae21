"""`plan run` on a node whose host key changed: refused, shown with the key served now, never a failed stage.

A refused host key makes the node unreachable until the user acts; it is not the stage's
failure. The message always names the key the node presents at that moment: the key may
change again, or back to one refused earlier (said again then, not kept quiet as already said),
and once the user trusts the new key the same `plan run` goes on.
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from tests.support.tmux_sessions import kill_plan_sessions

NODEDECK = Path(sys.executable).parent / "nodedeck"


def _lines(proc: subprocess.Popen) -> queue.Queue:
    q: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stdout:
            q.put(line.rstrip("\n"))
        q.put(None)
    threading.Thread(target=pump, daemon=True).start()
    return q


def _until(q: queue.Queue, want, seen: list[str], timeout: float = 60) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            line = q.get(timeout=max(end - time.monotonic(), 0.01))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if want(line):
            return line
    raise AssertionError("not seen; output so far:\n" + "\n".join(seen))


def test_plan_run_shows_the_key_served_now_and_goes_on_once_trusted(tmp_path, sshd):
    name = f"hk{uuid.uuid4().hex[:8]}"
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.testnode]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\n'
                   f'root = "{sshd.root / "work"}"\nconnect_timeout = 5\n')
    plan = tmp_path / "p.toml"
    plan.write_text(f'[plan]\nname = "{name}"\nnode = "testnode"\n[[stage]]\nid = "a"\ncommand = "true"\n')
    first = sshd.new_host_key()
    proc = subprocess.Popen([str(NODEDECK), "--config", str(cfg), "plan", "run", str(plan), "--poll", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    try:
        q = _lines(proc)
        _until(q, lambda s: "HOST KEY CHANGED" in s and first in s, seen)
        second = sshd.new_host_key()
        _until(q, lambda s: "HOST KEY CHANGED" in s and second in s, seen)
        sshd.serve_host_key(first)
        _until(q, lambda s: "HOST KEY CHANGED" in s and first in s, seen)
        sshd.trust_current_host_key()
        _until(q, lambda s: "a: " in s and "completed" in s, seen)
        assert proc.wait(timeout=60) == 0, "\n".join(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_plan_sessions(name)
    assert not any("failed" in s for s in seen), "\n".join(seen)

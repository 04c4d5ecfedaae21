"""Issue 41 item 13: one `node setup` of a node environment at a time, and what a setup started on the node stops
with it. Against the loopback sshd; the node's environment is a venv whose `python` lies (tests/support/
node_env.py `gated_env`): its `pip install` holds at a gate the test opens, so a setup is caught mid-install."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.node_env import gated_setup_node, running, started

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def gated_node(tmp_path):
    with gated_setup_node(tmp_path) as found:
        yield found


class Setup:
    """`nodedeck node setup gpu1` in a process of its own, its output read line by line as it comes."""

    def __init__(self, cfg: Path):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "cli.main", "--config", str(cfg), "node", "setup",
                                      "gpu1"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def out(self) -> str:
        return "\n".join(self.lines)

    def end(self, timeout: float = 300) -> int:
        rc = self.proc.wait(timeout)
        self.reader.join(10)
        return rc


def test_a_second_setup_names_the_first_and_waits_for_it(gated_node):
    cfg, gate = gated_node
    first = Setup(cfg)
    second = None
    try:
        [pip] = started(gate)
        second = Setup(cfg)
        deadline = time.monotonic() + 300
        while "waiting for that setup to end" not in second.out:
            assert len(started(gate)) == 1, f"a second pip install started beside the first:\n{second.out[-3000:]}"
            assert second.proc.poll() is None and time.monotonic() < deadline, second.out[-3000:]
            time.sleep(0.1)
        said = next(ln for ln in second.lines if "waiting for that setup to end" in ln)
        assert f"pid {first.proc.pid} (nodedeck node setup)" in said and "on the node)" in said, said
        assert started(gate) == [pip]            # the second one never started a pip beside the first's
        assert running(pip)
        (gate / "open").touch()
        assert first.end() == 0, first.out[-3000:]
        assert second.end() == 0, second.out[-3000:]
    finally:
        for s in (first, second):
            if s is not None and s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait(30)
    assert "gpu1 is ready" in first.out and "gpu1 is ready" in second.out
    assert "(waited for the setup of" in second.out and "nodedeck node setup" in second.out


def test_ctrl_c_stops_the_pip_it_started_and_a_rerun_goes_on(gated_node):
    cfg, gate = gated_node
    setup = Setup(cfg)
    try:
        [pip] = started(gate)
        assert running(pip)
        setup.proc.send_signal(signal.SIGINT)
        assert setup.end(120) == 130, setup.out[-3000:]
    finally:
        if setup.proc.poll() is None:
            setup.proc.kill()
            setup.proc.wait(30)
    assert not running(pip), "the pip the setup started still runs on the node"
    said = next(ln for ln in setup.lines if "interrupted (Ctrl-C)" in ln)
    assert f"(pid {pip} and its process group" in said and "pip install" in said, said
    (gate / "open").touch()
    rerun = Setup(cfg)
    assert rerun.end() == 0, rerun.out[-3000:]
    assert "no other setup of it runs" in rerun.out and "waiting" not in rerun.out


def test_a_setup_killed_outright_leaves_nothing_running_on_the_node(gated_node):
    """kill -9 of nodedeck: no Ctrl-C handler runs, yet the keeper sees its channel close and stops the pip."""
    cfg, gate = gated_node
    setup = Setup(cfg)
    try:
        [pip] = started(gate)
        setup.proc.kill()
        setup.end(60)
    finally:
        if setup.proc.poll() is None:
            setup.proc.kill()
            setup.proc.wait(30)
    deadline = time.monotonic() + 120
    while running(pip):
        assert time.monotonic() < deadline, "the pip of a killed setup still runs on the node"
        time.sleep(0.1)
    (gate / "open").touch()
    rerun = Setup(cfg)
    assert rerun.end() == 0, rerun.out[-3000:]
    assert "no other setup of it runs" in rerun.out

"""The dashboard never starts when stdout is not a terminal (issue 39, item 7): every command that would open it
says so in one line and exits 2, having started nothing; `demo --json` runs headless."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cli import cmd_demo
from cli.main import main

NODEDECK = str(Path(sys.executable).with_name("nodedeck"))


@pytest.mark.parametrize("argv", [[], ["tui"], ["--node", "local"], ["demo"], ["fleet", "--tui"]],
                         ids=["bare", "tui", "options", "demo", "fleet"])
def test_the_dashboard_refuses_a_stdout_that_is_not_a_terminal(argv, tmp_path):
    try:
        p = subprocess.run([NODEDECK, *argv], cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=90)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"`nodedeck {' '.join(argv)}` ran the dashboard into a pipe: "
                             f"{len(e.stdout or b'')} bytes written") from None
    err = p.stderr.decode()
    assert p.returncode == 2 and p.stdout == b"", (p.returncode, p.stdout[:300], err)
    assert len(err.splitlines()) == 1 and "the dashboard needs a terminal" in err, err
    assert not (tmp_path / "demo-work").exists()      # the demo made nothing before saying so


def test_demo_json_runs_headless(tmp_path, monkeypatch, capsys):
    ran: list[str] = []
    monkeypatch.setattr(cmd_demo, "_headless", lambda setup, args, say: ran.append("headless") or 0)
    monkeypatch.setattr(cmd_demo, "_dashboard", lambda *a: ran.append("dashboard") or 0)
    assert main(["demo", "--json", "--engine", "standin", "--work", str(tmp_path / "w")]) == 0
    assert ran == ["headless"]

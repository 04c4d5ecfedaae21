"""The CLI is one tool (issue 31, item 14): every --json command answers a failure with a JSON error object
on stdout, commands that only look take no state backup, and `make test` runs its demo in a fresh dir."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from cli.main import main
from ops.paths import config_dir
from ops.state.file import node_state_path
from tests.support.sshd import free_port
from tests.support.tmux_sessions import kill_plan_sessions

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def plan_file(tmp_path):
    name = f"j{uuid.uuid4().hex[:8]}"
    config_dir().mkdir(parents=True, exist_ok=True)
    (config_dir() / "nodes.toml").write_text(f'[nodes.local]\nroot = "{tmp_path / "work"}"\n')
    plan = tmp_path / "p.toml"
    plan.write_text(f'[plan]\nname = "{name}"\n[[stage]]\nid = "a"\ncommand = "true"\n')
    yield plan
    kill_plan_sessions(name)


def _failing(plan: Path) -> list[list[str]]:
    down = f"http://127.0.0.1:{free_port()}/metrics"
    return [
        ["metrics", "local", "--url", down, "--interval", "0", "--timeout", "5"],   # the server is down
        ["gpus", "nosuch"],
        ["host", "nosuch"],
        ["training", "nosuch", "/x.jsonl"],
        ["tail", "nosuch", "/x.log"],
        ["stage", "start", "nope", "--plan", str(plan)],
        ["stage", "logs", "nope", "--plan", str(plan)],
        ["plan", "show", str(plan.with_name("missing.toml"))],
        ["tmux", "ls", "nosuch"],
        ["todo", "list", "--node", "bad/name"],
    ]


def test_every_json_command_answers_a_failure_with_a_json_error_on_stdout(plan_file, capsys):
    for argv in _failing(plan_file):
        rc = main([*argv, "--json"])
        out, err = capsys.readouterr()
        assert rc != 0, argv
        assert err.startswith("nodedeck: "), (argv, err)
        doc = json.loads(out)                     # stdout holds a JSON answer, not nothing
        assert doc["error"] and "\n" not in doc["error"], (argv, doc)


def _rows(path: Path) -> list[tuple]:
    """Every row of every table of a state file but the audit (every command sent to the node, reads too)."""
    db = sqlite3.connect(path)
    try:
        tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
                  if t not in ("audit", "sqlite_sequence")]
        return [(t, *row) for t in tables for row in db.execute(f"SELECT * FROM {t}")]
    finally:
        db.close()


def test_commands_that_only_look_write_no_state_and_take_no_backup(plan_file, capsys):
    assert main(["plan", "run", str(plan_file), "--poll", "0.1"]) == 0
    state = node_state_path("local")
    bak, bak1 = state.with_name(state.name + ".bak"), state.with_name(state.name + ".bak.1")
    assert bak.exists()
    old = time.time() - 3 * 3600                 # an old backup: a store that may back up would rotate it now
    os.utime(bak, (old, old))
    before = {p.name: (p.read_bytes(), p.stat().st_mtime) for p in (bak, bak1) if p.exists()}
    rows = _rows(state)
    for argv in (["plan", "show", str(plan_file)], ["plan", "show", str(plan_file), "--json"],
                 ["stage", "logs", "a", "--plan", str(plan_file)], ["plan", "outcome", str(plan_file)]):
        main(argv)
    capsys.readouterr()
    after = {p.name: (p.read_bytes(), p.stat().st_mtime) for p in (bak, bak1) if p.exists()}
    assert after == before, "a command that only looks rotated the state backups"
    assert _rows(state) == rows, "a command that only looks wrote to the state"
    assert main(["stage", "verify", "a", "--plan", str(plan_file)]) == 0   # one that changes state still does
    assert bak.stat().st_mtime > old


def test_make_test_runs_the_headless_demo_in_a_fresh_dir():
    out = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    demo = [ln for ln in out.splitlines() if "nodedeck demo --headless" in ln]
    assert len(demo) == 1, out
    assert "mktemp -d" in demo[0] and "demo-work" in demo[0] and str(ROOT / "demo-work") not in demo[0]

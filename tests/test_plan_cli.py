"""`nodedeck plan run/show` and `nodedeck stage ...` end to end, locally and on the `testnode` sshd node."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from cli.main import main
from tests.support.sshd import free_port
from tests.support.tmux_sessions import kill_plan_sessions


@pytest.fixture
def sessions():
    """tmux sessions to kill at the end, by name (plan, stage ids)."""
    made: list[tuple[str, list[str]]] = []
    yield made
    for plan, stages in made:
        kill_plan_sessions(plan, stages)


def write_config(tmp_path, root: Path) -> Path:
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{root}"\nmax_parallel = 2\n')
    return cfg


PLAN = '''
[plan]
name = "{name}"
[vars]
greeting = "hello"
[[stage]]
id = "make"
title = "Make the greeting file: a long title that is shown whole in `plan show`, never cut, whatever the width"
command = "echo ${{greeting}} > greeting.txt"
outputs = ["greeting.txt"]
smoke = {{ command = "echo smoke", outputs = [], verify = [{{ kind = "log_contains", pattern = "smoke" }}] }}
[[stage]]
id = "read"
depends_on = ["make"]
command = "cat greeting.txt; echo rows: $(wc -l < greeting.txt)"
verify = [{{ kind = "log_contains", pattern = "^rows: 1$" }}]
'''


def test_plan_run_show_and_stage_commands(tmp_path, capsys, sessions):
    name = f"c{uuid.uuid4().hex[:8]}"
    sessions.append((name, ["make", "read"]))
    root = tmp_path / "work"
    cfg = write_config(tmp_path, root)
    plan = tmp_path / "p.toml"
    plan.write_text(PLAN.format(name=name))

    # the full run of `make` is refused before its smoke verified
    assert main(["--config", str(cfg), "stage", "start", "make", "--plan", str(plan)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "stage 'make'" in err and "--smoke" in err

    assert main(["--config", str(cfg), "plan", "run", str(plan), "--poll", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "make: launched smoke run" in out and "make: smoke run verified" in out and "read: launched full run" in out
    assert out.strip().splitlines()[-1].endswith(f"plan {name}: 2 completed")
    assert (root / "greeting.txt").read_text() == "hello\n"

    assert main(["--config", str(cfg), "plan", "show", str(plan)]) == 0
    out = capsys.readouterr().out
    assert ("Make the greeting file: a long title that is shown whole in `plan show`, never cut, "
            "whatever the width") in out
    checks = [ln.strip() for ln in out.splitlines() if "file_exists" in ln or "log_contains" in ln]
    assert [re.sub(r"\d+s ago", "Ns ago", ln) for ln in checks] == [   # each check with its age
        f"✓ Ns ago  file_exists {root}/greeting.txt: file, 6 B", "✓ Ns ago  log_contains /^rows: 1$/: found"]
    assert main(["--config", str(cfg), "plan", "show", str(plan), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["state"] for s in doc["stages"]] == ["completed", "completed"] and doc["ok"]
    assert doc["stages"][0]["smoke_verified"] is True

    assert main(["--config", str(cfg), "stage", "logs", "read", "--plan", str(plan)]) == 0
    assert capsys.readouterr().out == "hello\nrows: 1\n"

    # a check that no longer holds: verify says so and exits 1
    (root / "greeting.txt").unlink()
    assert main(["--config", str(cfg), "stage", "verify", "make", "--plan", str(plan), "--json"]) == 1
    v = json.loads(capsys.readouterr().out)
    assert v["state"] == "failed" and v["detail"] == f"file_exists {root}/greeting.txt: missing ✗"

    # restart runs it again (attempt 1 of a new run), plan run then completes it
    assert main(["--config", str(cfg), "stage", "restart", "make", "--plan", str(plan)]) == 0
    capsys.readouterr()
    assert main(["--config", str(cfg), "plan", "run", str(plan), "--poll", "0.1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert main(["--config", str(cfg), "stage", "skip", "nope", "--plan", str(plan)]) == 2
    assert "has no stage 'nope'" in capsys.readouterr().err


def test_plan_run_exit_1_and_subprocess(tmp_path, sessions):
    name = f"c{uuid.uuid4().hex[:8]}"
    sessions.append((name, ["bad", "next"]))
    root = tmp_path / "work"
    cfg = write_config(tmp_path, root)
    plan = tmp_path / "bad.toml"
    plan.write_text(f'[plan]\nname = "{name}"\n[[stage]]\nid = "bad"\ncommand = "echo started; exit 4"\n'
                    '[[stage]]\nid = "next"\ndepends_on = ["bad"]\ncommand = "true"\n')
    exe = Path(sys.executable).parent / "nodedeck"
    p = subprocess.run([str(exe), "--config", str(cfg), "plan", "run", str(plan), "--poll", "0.1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert "bad [failed]: exit 4: started" in p.stdout and "next [blocked]: dependency bad failed" in p.stdout
    p = subprocess.run([str(exe), "--config", str(cfg), "plan", "run", str(plan), "--node", "nosuch"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr == "nodedeck: unknown node 'nosuch' (known: local)\n"


def test_stage_on_ssh_node_uploads_into_a_new_remote_dir(tmp_path, capsys, sshd, sessions):
    name = f"s{uuid.uuid4().hex[:8]}"
    sessions.append((name, ["push", "srv"]))
    root = sshd.root / "remote-work"
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.testnode]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\nroot = "{root}"\n'
                   'connect_timeout = 5\n')
    (tmp_path / "rows.jsonl").write_text('{"a": 1}\n{"a": 2}\n{"a": 3}\n')
    port = free_port()
    plan = tmp_path / "remote.toml"
    plan.write_text(f'''
[plan]
name = "{name}"
node = "testnode"
[[stage]]
id = "push"
cwd = "job/deep"
upload = ["rows.jsonl:inputs/not/yet/there/rows.jsonl"]
command = "wc -l < inputs/not/yet/there/rows.jsonl > count.txt"
outputs = ["count.txt"]
verify = [
  {{ kind = "min_lines", path = "inputs/not/yet/there/rows.jsonl", min = 3 }},
  {{ kind = "json_field", path = "inputs/not/yet/there/rows.jsonl", field = "a", op = "==", value = 3 }},
]
[[stage]]
id = "srv"
kind = "server"
command = "exec python3 -m http.server {port} --bind 127.0.0.1"
verify = [{{ kind = "http_ok", url = "http://127.0.0.1:{port}/", timeout = 3 }}]
''')
    assert not root.exists()
    assert main(["--config", str(cfg), "plan", "run", str(plan), "--poll", "0.2", "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)          # with --json the transitions go to stderr
    assert "push: uploaded" in err
    assert doc["ok"], doc
    assert (root / "job/deep/inputs/not/yet/there/rows.jsonl").read_text().count("\n") == 3
    assert (root / "job/deep/count.txt").read_text().strip() == "3"
    srv = next(s for s in doc["stages"] if s["id"] == "srv")
    assert srv["state"] == "completed" and [c["text"] for c in srv["checks"]][-1].endswith("HTTP 200 ✓")
    assert main(["--config", str(cfg), "stage", "stop", "srv", "--plan", str(plan)]) == 0
    assert "stopped by user after it was up" in capsys.readouterr().out

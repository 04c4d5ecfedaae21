"""One workspace for the CLI and the dashboard: nodedeck.toml found upward, --work, $NODEDECK_WORK."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from cli.main import main
from ops import demo, workspace
from ops.errors import UserError
from ops.setup.record import recorded
from tests.support.tmux_sessions import kill_plan_sessions

PLAN = '''
[plan]
name = "{name}"
[vars]
word = "default"
[[stage]]
id = "say"
command = "echo ${{word}} > said.txt"
outputs = ["said.txt"]
[[stage]]
id = "quiet"
depends_on = ["say"]
command = "true"
'''


@pytest.fixture
def ws(tmp_path):
    name = f"w{uuid.uuid4().hex[:8]}"
    root = tmp_path / "proj"
    (root / "deep" / "er").mkdir(parents=True)
    (root / "nodes.toml").write_text(f'[nodes.local]\nroot = "{root / "work"}"\n')
    workspace.write(root, nodes="nodes.toml", variables={"word": "from-workspace", "other": "ignored"})
    plan = tmp_path / "p.toml"
    plan.write_text(PLAN.format(name=name))
    yield root, plan
    kill_plan_sessions(name)


def _states(capsys, *argv):
    assert main([*argv]) == 0
    return {s["id"]: s["state"] for s in json.loads(capsys.readouterr().out)["stages"]}


def test_the_cli_finds_the_workspace_upward_or_by_name(ws, tmp_path, monkeypatch, capsys):
    root, plan = ws
    monkeypatch.chdir(root / "deep" / "er")                   # found upward, like git
    assert main(["plan", "run", str(plan), "--poll", "0.1"]) == 0
    capsys.readouterr()
    assert (root / "work" / "said.txt").read_text() == "from-workspace\n"   # the workspace's [vars]
    assert (root / "state" / "nodedeck" / "nodes" / "local.sqlite").exists()

    def leave():                                              # a new process: nothing activated yet
        monkeypatch.setattr("ops.workspace._ACTIVE", None)
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "user-state"))

    monkeypatch.chdir(tmp_path)                               # outside: the user's own (empty) state
    leave()
    assert set(_states(capsys, "--config", str(root / "nodes.toml"), "plan", "show", str(plan), "--json").values()) \
        != {"completed"}
    leave()
    assert _states(capsys, "--work", str(root), "plan", "show", str(plan), "--json") == \
        {"say": "completed", "quiet": "completed"}
    leave()
    monkeypatch.setenv("NODEDECK_WORK", str(root))
    assert _states(capsys, "plan", "show", str(plan), "--json")["say"] == "completed"

    # an empty log is said to be empty, never a silent success
    assert main(["stage", "logs", "quiet", "--plan", str(plan)]) == 1
    assert "is empty" in capsys.readouterr().err


def test_a_bad_workspace_file_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "nodedeck.toml").write_text("[workspace]\nnodes = 3\n")
    monkeypatch.chdir(tmp_path)
    assert main(["nodes", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'nodedeck.toml'}:2: nodes must be a non-empty path" in err
    assert main(["--work", str(tmp_path / "nowhere"), "nodes"]) == 2
    assert "no nodedeck.toml there" in capsys.readouterr().err
    with pytest.raises(UserError, match="unknown table 'nodez'"):
        (tmp_path / "nodedeck.toml").write_text("[nodez]\n")
        workspace.load(tmp_path / "nodedeck.toml")


def test_a_second_demo_resumes_and_fresh_says_what_it_deletes(tmp_path):
    said: list[str] = []
    setup = demo.prepare(tmp_path / "work", fresh=False, say=said.append)
    assert (setup.work / "nodedeck.toml").exists() and workspace.current().root == setup.work
    local = recorded("local")   # the plan's nodedeck-train is the one beside this Python, with no --var
    assert local is not None and (Path(local.bin_dir) / "nodedeck-train").exists() and "train" not in setup.plan_vars
    (setup.work / "output.txt").write_text("kept")
    demo.prepare(tmp_path / "work", fresh=False, say=said.append)
    assert (setup.work / "output.txt").read_text() == "kept" and "resuming the demo" in said[-1]
    demo.prepare(tmp_path / "work", fresh=True, say=said.append)
    assert not (setup.work / "output.txt").exists()
    assert any(m.startswith("--fresh: deleting the earlier demo") and "files" in m for m in said)

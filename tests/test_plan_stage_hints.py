"""A skip can be undone, and every hint the CLI (and the dashboard) prints works when pasted (issue 31,
items 11 and 14): the plan's own path is in it, and `--force` is spelled as a command."""

from __future__ import annotations

import json
import re
import shlex
import uuid

import pytest

from cli.main import main
from ops.paths import config_dir
from tests.support.tmux_sessions import kill_plan_sessions


@pytest.fixture
def plan_file(tmp_path):
    """A plan on `local`, nodes.toml where a pasted command finds it (the user's config dir)."""
    name = f"h{uuid.uuid4().hex[:8]}"
    root = tmp_path / "work"
    config_dir().mkdir(parents=True, exist_ok=True)
    (config_dir() / "nodes.toml").write_text(f'[nodes.local]\nroot = "{root}"\nmax_parallel = 4\n')
    plan = tmp_path / "plans" / "p.toml"
    plan.parent.mkdir()
    plan.write_text(f'''[plan]
name = "{name}"
[[stage]]
id = "make"
command = "echo made > made.txt"
verify = [{{ kind = "file_exists", path = "made.txt" }}]
smoke = {{ command = "echo smoke", outputs = [], verify = [{{ kind = "log_contains", pattern = "smoke" }}] }}
[[stage]]
id = "slow"
command = "sleep 60"
[[stage]]
id = "after"
depends_on = ["slow"]
command = "true"
''')
    yield plan
    kill_plan_sessions(name)


def _hint(err: str) -> list[str]:
    """The first `nodedeck ...` command of a one-line error, as argv without `nodedeck`."""
    assert err.count("\n") == 1, err
    cmds = re.findall(r"`(nodedeck [^`]+)`", err)
    assert cmds, err
    return shlex.split(cmds[0])[1:]


def test_refusal_hints_run_when_pasted_from_another_directory(plan_file, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(plan_file.parent)
    assert main(["stage", "start", "make", "--plan", "p.toml"]) == 2
    hint = _hint(capsys.readouterr().err)
    assert hint[-1] == "--smoke" and str(plan_file) in hint
    monkeypatch.chdir(tmp_path)          # pasted in another directory, it still finds the plan
    assert main(hint) == 0, capsys.readouterr().err
    capsys.readouterr()

    assert main(["stage", "start", "slow", "--plan", str(plan_file)]) == 0
    capsys.readouterr()
    assert main(["stage", "start", "slow", "--plan", str(plan_file)]) == 2
    hint = _hint(capsys.readouterr().err)
    assert hint[:3] == ["stage", "restart", "slow"] and "--plan" in hint
    assert main(hint) == 0, capsys.readouterr().err
    capsys.readouterr()

    assert main(["stage", "start", "after", "--plan", str(plan_file)]) == 2
    err = capsys.readouterr().err
    assert "use --force" not in err
    hint = _hint(err)
    assert hint[:3] == ["stage", "start", "after"] and hint[-1] == "--force"
    assert main(hint) == 0, capsys.readouterr().err
    assert main(["stage", "stop", "slow", "--plan", str(plan_file), "--grace", "1"]) == 0


def test_a_skip_is_undone_by_unskip_and_by_verify(plan_file, capsys):
    plan = str(plan_file)
    assert main(["stage", "start", "make", "--plan", plan, "--force"]) == 0
    for _ in range(100):
        capsys.readouterr()
        main(["stage", "verify", "make", "--plan", plan, "--json"])
        if json.loads(capsys.readouterr().out)["state"] == "completed":
            break
    assert main(["stage", "skip", "make", "--plan", plan, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "skipped"
    assert main(["stage", "unskip", "make", "--plan", plan, "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["state"] == "completed" and v["detail"].startswith("verified")
    assert main(["stage", "unskip", "make", "--plan", plan]) == 2
    assert "is not skipped" in capsys.readouterr().err

    assert main(["stage", "skip", "make", "--plan", plan]) == 0
    capsys.readouterr()
    assert main(["stage", "verify", "make", "--plan", plan, "--json"]) == 0   # a verdict asked for: checks decide
    assert json.loads(capsys.readouterr().out)["state"] == "completed"

"""`nodedeck tmux ...` end to end: real tmux, real store, LocalHost and a real sshd."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from cli.main import main
from ops.node_handle import NodeHandle
from ops.state import StateStore
from ops.tmux import tmux_name
from tests.support.tmux_sessions import TMUX

NODEDECK = str(Path(sys.executable).with_name("nodedeck"))


@pytest.fixture
def names():
    made: list[str] = []

    def new():
        made.append(f"c-{uuid.uuid4().hex[:10]}")
        return made[-1]

    yield new
    for n in made:
        subprocess.run([*TMUX, "kill-session", "-t", f"={tmux_name(n)}"], capture_output=True)


@pytest.fixture
def config(tmp_path):
    root = tmp_path / "local root"
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{root}"\n')
    return cfg, root


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_start_ls_logs_stop(capsys, config, names):
    cfg, root = config
    name = names()
    rc, out, _ = run(capsys, "--config", str(cfg), "tmux", "start", "local", name, "--env", "GREETING=hi there",
                     "--", "bash", "-c", 'echo "$GREETING from $(pwd)"; exec sleep 60')
    assert rc == 0 and out.startswith(f"started {name} on local (pid ")
    assert f"tmux session nd-{name}" in out and f"{root}/.nodedeck/runs/{name}.log" in out

    rc, out, _ = run(capsys, "--config", str(cfg), "tmux", "ls", "local", "--json")
    (row,) = json.loads(out)
    assert row["session"] == name and row["state"] == "running" and row["tmux_session"] == tmux_name(name)
    assert psutil.pid_exists(row["pid"])

    rc, out, _ = run(capsys, "--config", str(cfg), "tmux", "ls", "local")
    assert rc == 0 and out.splitlines()[0].split()[:3] == ["SESSION", "STATE", "PID"]
    assert name in out and "running" in out

    rc, out, _ = run(capsys, "--config", str(cfg), "tmux", "logs", "local", name, "-n", "5")
    assert rc == 0 and out == f"hi there from {root}\n"

    rc, out, _ = run(capsys, "--config", str(cfg), "tmux", "stop", "local", name, "--grace", "5", "--json")
    res = json.loads(out)
    assert rc == 0 and res["stopped"] and res["outcome"] == "terminated" and res["pid"] == row["pid"]
    assert res["session"] == name   # the --json keys stay as scripts read them
    assert not psutil.pid_exists(row["pid"]) or psutil.Process(row["pid"]).status() == psutil.STATUS_ZOMBIE

    rc, out, _ = run(capsys, "--config", str(cfg), "tmux", "stop", "local", name)
    assert rc == 0 and "already exited with status 143" in out

    audit = StateStore.for_node("local").audit_log(limit=1000)
    assert any("kill -TERM" in a.command for a in audit)


def test_start_of_a_job_that_dies_reports_its_status_and_log(capsys, config, names):
    cfg, _ = config
    name = names()
    rc, out, _ = run(capsys, "--config", str(cfg), "tmux", "start", "local", name, "--shell", "--",
                     "echo started; echo 'boom: no such model' >&2; sleep 0.2; exit 3")
    assert rc in (0, 1)
    if rc == 0:  # seen alive for a moment: the next look must say it exited
        rc, out, _ = run(capsys, "--config", str(cfg), "tmux", "logs", "local", name, "-f")
        assert "boom: no such model" in out
        rc, out, _ = run(capsys, "--config", str(cfg), "tmux", "ls", "local", "--json")
        (row,) = json.loads(out)
        assert (row["state"], row["exit_code"]) == ("exited", 3)
    else:
        assert "already exited with status 3" in out and "boom: no such model" in out


def test_follow_prints_until_the_run_ends(capsys, config, names):
    cfg, _ = config
    name = names()
    run(capsys, "--config", str(cfg), "tmux", "start", "local", name, "--shell", "--",
        "for i in 1 2 3; do echo tick $i; sleep 0.1; done")
    rc, out, err = run(capsys, "--config", str(cfg), "tmux", "logs", "local", name, "-f", "-n", "100")
    assert rc == 0 and out == "tick 1\ntick 2\ntick 3\n"
    assert f"{name} exited with status 0" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["tmux", "start", "local", "bad.name", "--", "true"], "session name"),
        (["tmux", "start", "nowhere", "s", "--", "true"], "unknown node 'nowhere'"),
        (["tmux", "start", "local", "s", "--shell", "--", "echo", "a"], "--shell takes"),
        (["tmux", "start", "local", "s", "--env", "A-B=1", "--", "true"], "environment variable name"),
        (["tmux", "stop", "local", "never-ran"], "no session never-ran"),
        (["tmux", "logs", "local", "never-ran"], "no session never-ran"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, config, argv, message):
    cfg, _ = config
    rc, out, err = run(capsys, "--config", str(cfg), *argv)
    assert rc == 2 and err.startswith("nodedeck: ") and message in err and len(err.splitlines()) == 1


def test_second_start_is_refused(capsys, config, names):
    cfg, _ = config
    name = names()
    assert run(capsys, "--config", str(cfg), "tmux", "start", "local", name, "--", "sleep", "60")[0] == 0
    rc, _, err = run(capsys, "--config", str(cfg), "tmux", "start", "local", name, "--", "sleep", "60")
    assert rc == 2 and f"session {name} is already running on local" in err


def test_cli_over_ssh(capsys, sshd, tmp_path, names):
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.gpu]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\n'
                   f'root = "{tmp_path}/remote root"\n')
    name = names()

    def nd(*argv):
        return run(capsys, "--config", str(cfg), "tmux", *argv)

    rc, _, err = nd("start", "gpu", name, "--cwd", "work dir", "--", "bash", "-c", "pwd; exec sleep 60")
    assert rc in (0, 1), err  # the cwd does not exist: the job ends at once, the log says why
    rc, out, err = nd("logs", "gpu", name, "-f")
    assert "work dir: No such file or directory" in out and f"{name} exited with status 1" in err
    (tmp_path / "remote root" / "work dir").mkdir()
    rc, out, err = nd("start", "gpu", name, "--cwd", "work dir", "--json", "--", "bash", "-c", "pwd; exec sleep 60")
    rec = json.loads(out)
    assert rc == 0 and rec["state"] == "running" and rec["attempt"] == 2, err
    assert rec["log_path"] == f"{tmp_path}/remote root/.nodedeck/runs/{name}.log"
    rc, out, _ = nd("stop", "gpu", name, "--json")
    assert rc == 0 and json.loads(out)["outcome"] == "terminated"
    log = Path(rec["log_path"]).read_text().splitlines()  # both attempts append to the one log
    assert log[-2:] == [f"{tmp_path}/remote root/work dir", "Terminated"]


def test_cli_as_a_subprocess(config, names):
    cfg, _ = config
    name = names()

    def nd(*argv):
        return subprocess.run([NODEDECK, "--config", str(cfg), "tmux", *argv], capture_output=True,
                              text=True, timeout=60)

    p = nd("start", "local", name, "--shell", "--", 'echo "it\'s up"; exec sleep 60')
    assert p.returncode == 0 and p.stdout.startswith(f"started {name} on local"), p.stderr
    p = nd("ls", "local", "--json")
    (row,) = json.loads(p.stdout)
    assert row["state"] == "running"
    p = nd("stop", "local", "bad:name")
    assert p.returncode == 2 and p.stderr.startswith("nodedeck: session name") and "Traceback" not in p.stderr
    with NodeHandle.open("local", cfg) as handle:
        assert handle.runner.stop(name, grace=2).stopped
        assert handle.runner.tail(name).startswith("it's up\n")


def test_node_handle_bundles_host_store_runner(config, names):
    cfg, root = config
    with NodeHandle.open("local", cfg) as handle:
        assert handle.root == str(root) and handle.run_dir == f"{root}/.nodedeck/runs"
        assert handle.resolve("data/x") == f"{root}/data/x" and handle.resolve("/abs") == "/abs"
        assert handle.resolve("~/y") == str(Path.home() / "y")
        assert handle.runner is handle.runner
        assert handle.runner.store is handle.store and handle.runner.host is handle.host
        name = names()
        rec = handle.runner.start(name, ["sleep", "60"])
        assert handle.store.audit_log(limit=10)[-1].host == "local"
        assert handle.runner.stop(name, grace=2).stopped
    assert handle.store.latest_tmux_session_run(name).id == rec.id  # reopened lazily after close
    handle.close()

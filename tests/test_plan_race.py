"""Two nodedeck processes on one plan launch every stage exactly once (issue 12 item 3).

Real processes (`nodedeck plan run`, twice at once), real tmux, one real SQLite
state file. Each stage's command appends a marker line, so a double launch is
seen on the node itself, not only in the runs table.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from ops.state import StateStore
from ops.tmux import tmux_name
from tests.support.tmux_sessions import TMUX, kill_plan_sessions

TRIALS = 10
STAGES = ("a", "b", "c")


def _plan(path: Path, name: str, work: Path) -> None:
    body = [f'[plan]\nname = "{name}"\nnode = "local"\nroot = "{work}"\n']
    for sid, deps in zip(STAGES, ([], [], ["a", "b"])):
        body.append(f'[[stage]]\nid = "{sid}"\ndepends_on = {deps!r}\n'.replace("'", '"')
                    + f'command = "echo $$ >> marks/{sid}; echo ok > out/{sid}"\n'
                    + f'outputs = ["out/{sid}"]\n')
    path.write_text("\n".join(body))


def test_two_plan_runs_race_and_launch_each_stage_once(tmp_path):
    """10 trials (run side by side to stay fast), each two `plan run` on one fresh plan."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    trials = []
    for trial in range(TRIALS):
        work = tmp_path / f"w{trial}"
        (work / "marks").mkdir(parents=True)
        (work / "out").mkdir()
        cfg = tmp_path / f"nodes{trial}.toml"
        cfg.write_text(f'[nodes.local]\nroot = "{work}"\n')
        name = f"race{uuid.uuid4().hex[:6]}"
        plan = tmp_path / f"{name}.toml"
        _plan(plan, name, work)
        argv = [sys.executable, "-m", "cli.main", "--config", str(cfg), "plan", "run", str(plan), "--poll", "0.1"]
        trials.append((name, work, [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                                    for _ in range(2)]))
    doubles, failed, outs = [], [], {}
    try:
        for trial, (name, work, procs) in enumerate(trials):
            outs[trial] = [p.communicate(timeout=120)[0].decode() for p in procs]
    finally:
        for name, _, procs in trials:
            for p in procs:
                p.kill()
            kill_plan_sessions(name)
    store = StateStore(Path(env["XDG_STATE_HOME"]) / "nodedeck" / "nodes" / "local.sqlite")
    try:
        for trial, (name, work, procs) in enumerate(trials):
            assert all(p.returncode == 0 for p in procs), (trial, outs[trial])
            for sid in STAGES:
                marks = (work / "marks" / sid).read_text().split() if (work / "marks" / sid).exists() else []
                if len(marks) != 1:
                    doubles.append((trial, sid, len(marks)))
                runs = store.runs_for_stage(f"{name}/{sid}")
                if len(runs) != 1 or runs[0].state != "exited" or runs[0].exit_code != 0:
                    failed.append((trial, sid, [(r.state, r.exit_code) for r in runs]))
            states = {sid: row.state for sid, row in store.get_stage_states(name).items()}
            assert states == {sid: "completed" for sid in STAGES}, (trial, states, outs[trial])
    finally:
        store.close()
    assert doubles == [] and failed == []


def test_a_launch_that_finds_the_session_live_leaves_no_run_behind(tmp_path):
    """The window between a runner's look and its launch: the loser records nothing (no failed run that
    would stand as the stage's latest)."""
    from ops.hosts.local import LocalHost
    from ops.tmux import AlreadyRunning, TmuxRunner

    session = f"race{uuid.uuid4().hex[:6]}"
    store = StateStore(tmp_path / "node.sqlite")
    winner = TmuxRunner(LocalHost(), store, str(tmp_path / "runs"))
    loser = TmuxRunner(LocalHost(), store, str(tmp_path / "runs"))
    try:
        first = winner.start(session, "sleep 30", stage="p/s")
        loser.status = lambda s: winner._refresh([], tmux_sessions=["none"])[0]   # it looked before the winner launched
        try:
            loser.start(session, "sleep 30", stage="p/s")
            raise AssertionError("launched twice")
        except AlreadyRunning:
            pass
        assert [r.id for r in store.runs_for_stage("p/s")] == [first.id]
        assert store.latest_run("p/s").state == "running"
    finally:
        subprocess.run([*TMUX, "kill-session", "-t", f"={tmux_name(session)}"], capture_output=True)
        store.close()


def test_the_launch_lease_is_one_holders_until_it_expires_and_checks_the_latest_run(tmp_path):
    store = StateStore(tmp_path / "node.sqlite")
    try:
        def take(who: str, ttl: float = 60.0, expect: int | None = None) -> str | None:
            return store.acquire_lease("p", "s", who, ttl=ttl, run_stage="p/s", expect_run=expect)

        assert take("A") is None
        assert "being launched by A" in take("B")
        store.release_lease("p", "s", "B")   # not B's: A's lease stays
        assert "being launched by A" in take("B")
        store.release_lease("p", "s", "A")
        assert take("B", ttl=0.0) is None      # expires at once
        assert take("A") is None               # an expired lease is free
        store.release_lease("p", "s", "A")
        run = store.insert_run(tmux_session="s", command="true", log_path="/l", exit_path="/e", run_key="p/s")
        assert "launched by another process since" in take("B")   # B looked before that run
        assert take("B", expect=run.id) is None
    finally:
        store.close()


def test_a_lease_left_by_a_dead_process_on_this_machine_is_free(tmp_path):
    import socket

    from ops.plan.launch import holder_gone

    dead = subprocess.Popen(["true"])
    dead.wait()
    assert holder_gone(f"{socket.gethostname()}:{dead.pid}:abc")
    assert not holder_gone(f"{socket.gethostname()}:{os.getpid()}:abc")
    assert not holder_gone(f"elsewhere:{dead.pid}:abc")   # another machine's process cannot be asked
    store = StateStore(tmp_path / "node.sqlite")
    try:
        dead_holder = f"{socket.gethostname()}:{dead.pid}:abc"
        assert store.acquire_lease("p", "s", dead_holder, ttl=600, run_stage="p/s", expect_run=None) is None
        assert store.acquire_lease("p", "s", "me", ttl=600, run_stage="p/s", expect_run=None,
                                   gone=holder_gone) is None
    finally:
        store.close()

"""tmux sessions of plan stages (issue 15 item 11): named by plan and workspace, so two work dirs never
share one, and a verified job leaves no dead session behind. Real tmux, SQLite and LocalHost."""

from __future__ import annotations

import subprocess

from ops.hosts.local import LocalHost
from ops.node_handle import NodeHandles
from ops.run.scheduler import Scheduler
from ops.run.views import StageState as S
from ops.state import StateStore
from ops.tmux import TmuxRunner, tmux_name
from tests.support.tmux_sessions import TMUX
from tests.test_plan_scheduler import Node, env, run_until  # noqa: F401 - env is the fixture

__all__ = ["env"]


def sessions() -> set[str]:
    res = subprocess.run([*TMUX, "list-sessions", "-F", "#{session_name}"], capture_output=True, text=True)
    return set(res.stdout.split())


def test_two_workspaces_run_the_same_plan_side_by_side(env, tmp_path):
    plan = env.plan('''
[[stage]]
id = "a"
command = "sleep 1.5; echo ok > a.out"
outputs = ["a.out"]
''')
    other_root = tmp_path / "other-work"
    other_root.mkdir()
    host, store = LocalHost(), StateStore(tmp_path / "other.sqlite")
    other = Scheduler(plan, NodeHandles.of(Node("local", str(other_root), 4, host, store,
                                                TmuxRunner(host, store, str(other_root / ".runs")))), auto=True)
    first = env.scheduler(plan, auto=True)
    stage = plan.stage("a")
    assert first.ctx.tmux_session(stage) != other.ctx.tmux_session(stage)
    both = [first.tick(), other.tick()]
    assert [r.views[0].state for r in both] == [S.RUNNING, S.RUNNING], [r.views[0].detail for r in both]
    run_until(first, lambda r: r.done)
    run_until(other, lambda r: r.done)
    assert (env.root / "a.out").exists() and (other_root / "a.out").exists()
    store.close()


def test_a_verified_job_leaves_no_dead_session_and_a_failed_one_stays_to_inspect(env):
    plan = env.plan('''
[[stage]]
id = "good"
command = "echo ok > good.out"
outputs = ["good.out"]
[[stage]]
id = "bad"
command = "echo oops; exit 3"
''')
    s = env.scheduler(plan, auto=True)
    res, _ = run_until(s, lambda r: r.done)
    v = {x.id: x for x in res.views}
    assert v["good"].state is S.COMPLETED and v["bad"].state is S.FAILED
    left = sessions()
    assert tmux_name(v["good"].tmux_session) not in left
    assert tmux_name(v["bad"].tmux_session) in left


def test_stop_and_restart_refuse_a_foreign_process_in_the_stage_session(tmp_path, capsys):
    """A process nodedeck did not start in the stage's (workspace-named) tmux session: both refuse, name
    it, signal nothing."""
    import os
    import uuid

    from cli.main import main
    from ops.plan.parse import load_plan

    name = f"x{uuid.uuid4().hex[:8]}"
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{tmp_path}/work"\n')
    plan_file = tmp_path / "p.toml"
    plan_file.write_text(f'[plan]\nname = "{name}"\n[[stage]]\nid = "job"\ncommand = "echo mine > mine.txt"\n')
    plan, nodes = load_plan(plan_file), NodeHandles(cfg)
    tmux = tmux_name(Scheduler(plan, nodes).ctx.tmux_session(plan.stage("job")))
    nodes.close()
    subprocess.run([*TMUX, "new-session", "-d", "-s", tmux, "sleep 60"], check=True)
    try:
        pid = subprocess.run([*TMUX, "list-panes", "-t", f"={tmux}:", "-F", "#{pane_pid}"], capture_output=True,
                             text=True, check=True).stdout.strip()
        for action, done in (("stop", "stopped"), ("restart", "restarted")):
            assert main(["--config", str(cfg), "stage", action, "job", "--plan", str(plan_file)]) == 2
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0 and f"did not start (pid {pid}); nothing {done}" in err
            assert f"(`tmux -L nodedeck attach-session -t ={tmux}`)" in err   # the server it is in, pasted
        os.kill(int(pid), 0)   # still alive: never signalled
        assert not (tmp_path / "work" / "mine.txt").exists()
    finally:
        subprocess.run([*TMUX, "kill-session", "-t", f"={tmux}"], capture_output=True)

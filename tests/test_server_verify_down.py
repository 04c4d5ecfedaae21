"""Verifying a server that was stopped after it was up (issue 39, item 6): it did its part, so it stays
`completed, down now`, its checks failing now, whoever stopped it (the demo's end, `x`) and however it is
verified again (`v`, `nodedeck stage verify`)."""

from __future__ import annotations

import uuid

from cli.main import main
from ops import demo
from ops.run.views import StageState as S
from tests.support.sshd import free_port
from tests.support.tmux_sessions import kill_plan_sessions
from tests.test_plan_cli import write_config
from tests.test_plan_scheduler import env, run_until  # noqa: F401 - env is the fixture

SERVER = '''
[[stage]]
id = "srv"
kind = "server"
command = "exec python3 -m http.server {port} --bind 127.0.0.1"
verify = [{{ kind = "http_ok", url = "http://127.0.0.1:{port}/", timeout = 2 }}]
'''


def up(env, plan):  # noqa: F811
    s = env.scheduler(plan, auto=True, server_check_interval=0.05)
    run_until(s, lambda r: r.views[0].state is S.COMPLETED)
    return s


def test_verify_after_the_demo_stopped_its_server_keeps_it_completed(env):  # noqa: F811
    plan = env.plan(SERVER.format(port=free_port()))
    demo.stop_servers(up(env, plan), say=lambda m: None)          # the demo's end
    for s in (env.scheduler(plan), env.scheduler(plan)):           # a dashboard opened afterwards, `v` twice
        view = s.verify("srv")
        assert view.state is S.COMPLETED and view.down_after_up, (view.state, view.detail)
        assert view.checks and not any(c.ok for c in view.checks)  # failing now, because it is down
        assert s.tick().views[0].state is S.COMPLETED


def test_verify_after_x_keeps_it_completed_too(env):  # noqa: F811
    plan = env.plan(SERVER.format(port=free_port()))
    s = up(env, plan)
    s.stop("srv", grace=2.0)                                       # `x`
    view = s.verify("srv")                                         # `v`
    assert view.state is S.COMPLETED and view.down_after_up, (view.state, view.detail)


def test_stage_verify_on_the_cli_never_fails_a_stopped_server(tmp_path, capsys):
    name = f"v{uuid.uuid4().hex[:8]}"
    cfg = write_config(tmp_path, tmp_path / "work")
    plan = tmp_path / "p.toml"
    plan.write_text(f'[plan]\nname = "{name}"\n' + SERVER.format(port=free_port()))
    try:
        assert main(["--config", str(cfg), "plan", "run", str(plan), "--poll", "0.2"]) == 0
        assert main(["--config", str(cfg), "stage", "stop", "srv", "--plan", str(plan)]) == 0
        capsys.readouterr()
        assert main(["--config", str(cfg), "stage", "verify", "srv", "--plan", str(plan)]) == 1   # down: not serving
        out = capsys.readouterr().out
        assert "[completed, down now]" in out and "[failed]" not in out, out
        assert main(["--config", str(cfg), "plan", "show", str(plan)]) == 0
        assert "srv  [completed, down now]" in capsys.readouterr().out
    finally:
        kill_plan_sessions(name)

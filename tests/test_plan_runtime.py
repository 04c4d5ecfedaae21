"""What a stage runs with (issue 13): output directories made before launch, the environment set
explicitly ([plan] env and setup, then the stage's) and the PATH recorded, and a server's liveness
checked without loading it. Real tmux, SQLite and LocalHost."""

from __future__ import annotations

import textwrap
import time

from ops.run.views import StageState as S
from tests.test_plan_scheduler import POLL, env, run_until  # noqa: F401 - env is the fixture

__all__ = ["env"]


def test_output_dirs_are_made_and_env_and_setup_reach_the_command(env, tmp_path):
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "activate").write_text(f'export PATH="{venv}:$PATH"\nexport ACTIVATED=yes\n')
    plan = env.plan('''
[[stage]]
id = "a"
setup = "export FROM_STAGE_SETUP=2"
env = { FOO = "stage-${plan.name}" }
command = "echo $PATH > deep/er/path.txt; echo $FOO $BAR $ACTIVATED $FROM_STAGE_SETUP > deep/er/env.txt"
outputs = ["deep/er/path.txt", "deep/er/env.txt"]
''', header=f'env = {{ BAR = "plan", FOO = "plan" }}\nsetup = "source {venv}/activate"')
    s = env.scheduler(plan, auto=True)
    res, _ = run_until(s, lambda r: r.done)
    v = res.views[0]
    assert v.state is S.COMPLETED, v.detail
    assert (env.root / "deep/er/env.txt").read_text().split() == [f"stage-{plan.name}", "plan", "yes", "2"]
    path = (env.root / "deep/er/path.txt").read_text().strip()
    assert path.startswith(f"{venv}:") and v.env_path == path
    assert s.view("a").to_json()["env_path"] == path


def test_a_failing_setup_line_fails_the_run_without_running_the_command(env):
    plan = env.plan('''
[[stage]]
id = "a"
setup = "false"
command = "echo ran > ran.txt"
''')
    s = env.scheduler(plan, auto=True)
    res, _ = run_until(s, lambda r: r.done)
    assert res.views[0].state is S.FAILED and res.views[0].detail.startswith("exit 1")
    assert not (env.root / "ran.txt").exists()


def test_a_server_is_declared_up_by_one_health_generate_then_kept_by_health(env, tmp_path):
    from tests.support.sshd import free_port

    port = free_port()
    server = tmp_path / "server.py"
    server.write_text(textwrap.dedent(f'''
        import http.server, sys
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                with open("hits.log", "a") as f:
                    f.write(self.path + "\\n")
                self.send_response(200 if self.path in ("/health", "/health_generate") else 404)
                self.end_headers()
            def log_message(self, *a):
                pass
        print("server ready", flush=True)
        http.server.HTTPServer(("127.0.0.1", {port}), H).serve_forever()
    '''))
    plan = env.plan(f'''
[[stage]]
id = "srv"
kind = "server"
command = "exec python3 {server}"
verify = [{{ kind = "http_ok", url = "http://127.0.0.1:{port}/health_generate", timeout = 2 }}]
''')
    s = env.scheduler(plan, auto=True, server_check_interval=0.05)
    run_until(s, lambda r: r.views[0].state is S.COMPLETED)
    for _ in range(8):
        time.sleep(POLL)
        assert s.tick().views[0].state is S.COMPLETED
    hits = (env.root / "hits.log").read_text().split()
    assert hits.count("/health_generate") == 1 and hits.count("/health") >= 5, hits
    s.stop("srv", grace=2.0)

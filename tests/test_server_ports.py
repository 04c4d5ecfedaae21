"""Servers own their port (issue 39, item 4): a server stage whose port another process holds is refused before
launch, naming the holder; an http check counts only when the stage's own processes listen; a server that
exited quotes its log's last line; plan check understands a server's `port`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ops.hosts.local import LocalHost
from ops.plan.lint import lint_plan
from ops.plan.parse import PlanError, parse_plan
from ops.run.ports import scan_port
from ops.run.views import StageState as S
from tests.support.hostile_node import fake_commands, wrapper
from tests.support.sshd import free_port
from tests.test_plan_scheduler import env, run_until, states  # noqa: F401 - env is the fixture
from tests.test_ssh_host import node_host


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Foreign:
    """An HTTP server that is not the stage's (another workspace's, the user's own): `python3 -m http.server`."""

    def __init__(self, port: int, cwd: Path, *extra: str):
        self.port = port
        self.proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", *extra],
                                     cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not listening(port):
            assert self.proc.poll() is None and time.monotonic() < deadline, "the foreign server did not start"
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def foreign(tmp_path):
    made: list[Foreign] = []

    def start(port: int, *extra: str) -> Foreign:
        made.append(Foreign(port, tmp_path, *extra))
        return made[-1]

    yield start
    for f in made:
        if f.proc.poll() is None:
            f.stop()


SERVER = '''
[[stage]]
id = "srv"
kind = "server"
command = "exec python3 -m http.server {port} --bind 127.0.0.1"
verify = [{{ kind = "http_ok", url = "http://127.0.0.1:{port}/", timeout = 2 }}]
[[stage]]
id = "client"
depends_on = ["srv"]
command = "curl -sf http://127.0.0.1:{port}/ > page.html"
outputs = ["page.html"]
'''


def test_a_port_held_by_an_unrelated_process_refuses_the_server_naming_it(env, foreign):  # noqa: F811
    port = free_port()
    other = foreign(port)
    plan = env.plan(SERVER.format(port=port))
    s = env.scheduler(plan, auto=True, server_check_interval=0.05)
    res, history = run_until(s, lambda r: r.done)
    assert all(states(h)["srv"] is not S.COMPLETED for h in history), [h.views[0].detail for h in history]
    srv = res.views[0]
    assert srv.state is S.FAILED and states(res)["client"] is S.BLOCKED
    assert f"port {port} on local is in use by pid {other.pid}" in srv.detail, srv.detail
    assert "http.server" in srv.detail and "\n" not in srv.detail
    assert s.ctx.handle(plan.stages[0]).store.latest_run(f"{plan.name}/srv") is None     # nothing was launched
    assert any(f"port {port}" in e.message for e in s.events if e.stage == "srv")


def test_an_http_check_answered_by_another_process_never_counts(env, foreign, tmp_path):  # noqa: F811
    """The stage's server waits (a gate file) while another process takes its port: the checks are answered,
    by the other one, so they fail; once let go, the stage's server cannot bind and exits, and the verdict
    quotes the last line of its log."""
    port = free_port()
    gate = tmp_path / "go"
    plan = env.plan(f'''
[[stage]]
id = "srv"
kind = "server"
command = "while [ ! -f {gate} ]; do sleep 0.05; done; exec python3 -m http.server {port} --bind 127.0.0.1"
verify = [{{ kind = "http_ok", url = "http://127.0.0.1:{port}/", timeout = 2 }}]
''')
    s = env.scheduler(plan, server_check_interval=0)
    s.start("srv")                          # the port is free: launched
    other = foreign(port)
    for _ in range(3):
        view = s.tick().views[0]
        assert view.state is S.VERIFYING, (view.state, view.detail)
        assert f"pid {other.pid}" in view.detail and "not this stage's" in view.detail, view.detail
    gate.write_text("")
    res, _ = run_until(s, lambda r: r.views[0].state.terminal)
    srv = res.views[0]
    assert srv.state is S.FAILED and "server exited with status 1" in srv.detail
    assert "Address already in use" in srv.detail, srv.detail


def test_the_stages_own_server_is_completed_and_its_port_named_in_plan_check(env):  # noqa: F811
    port = free_port()
    plan = env.plan(f'''
[vars]
port = "{port}"
[[stage]]
id = "srv"
kind = "server"
port = "${{port}}"
command = "exec python3 -m http.server ${{port}} --bind 127.0.0.1"
verify = [{{ kind = "http_ok", url = "http://127.0.0.1:${{port}}/", timeout = 2 }}]
''')
    assert plan.stages[0].port == "${port}"
    s = env.scheduler(plan, auto=True, server_check_interval=0.05)
    res, _ = run_until(s, lambda r: r.views[0].state is S.COMPLETED)
    assert all(c.ok for c in res.views[0].checks)
    s.stop("srv", grace=2.0)


def test_a_declared_port_is_refused_even_without_an_http_check(env, foreign):  # noqa: F811
    port = free_port()
    other = foreign(port)
    plan = env.plan(f'''
[[stage]]
id = "srv"
kind = "server"
port = {port}
command = "exec python3 -m http.server {port} --bind 127.0.0.1"
verify = [{{ kind = "process_alive" }}]
''')
    s = env.scheduler(plan)
    with pytest.raises(Exception, match=rf"port {port} on local is in use by pid {other.pid}"):
        s.start("srv")
    assert s.tick().views[0].state is S.FAILED


def test_the_scan_names_the_holder_locally_and_over_ssh(sshd, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        for host in (LocalHost(), node_host(sshd, tmp_path)):
            scan = scan_port(host, port)
            assert scan.known and scan.listening and [h.pid for h in scan.holders] == [os.getpid()], scan
            assert scan.foreign(pid=None, pgid=None)
            assert not scan.foreign(pid=None, pgid=os.getpgid(0))     # the test's own group holds it
        free = free_port()
        assert not scan_port(LocalHost(), free).listening


def test_a_holders_command_line_is_shown_never_obeyed(env, tmp_path):  # noqa: F811
    port = free_port()
    evil = tmp_path / "evil\x1b]52;c;aGk=\x07\u202ename.py"
    evil.write_text(f"import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', {port}))\ns.listen(1)\n"
                    "print('up', flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, str(evil)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        plan = env.plan(SERVER.format(port=port))
        s = env.scheduler(plan)
        with pytest.raises(Exception) as err:
            s.start("srv")
        msg = str(err.value)
        assert "\x1b" not in msg and "\u202e" not in msg and "\\x1b]52" in msg and "\\u202e" in msg, msg
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("answer", ['{"proc": true, "listening": 7, "holders": []}', "[[[[", "",
                                    '{"proc": true, "listening": true, "holders": [{"pid": -1, "pgid": 1, '
                                    '"ancestors": [], "cmd": "x", "run": ""}]}'],
                         ids=["wrong-type", "not-json", "nothing", "bad-pid"])
def test_a_lying_node_scan_is_unknown_not_a_crash(sshd, tmp_path, answer):
    """The node's scan answers a lie: the scan says it cannot tell, so nothing is refused on its word."""
    prog = tmp_path / "lie.py"
    prog.write_text(f"import sys\nsys.stdout.write({answer!r})\n")
    fake_commands(sshd, tmp_path / "bin", {"bash": wrapper("bash", "port-scan", prog)})
    host = node_host(sshd, tmp_path)
    try:
        scan = scan_port(host, 80)
        assert not scan.known and not scan.foreign(None, None), scan
    finally:
        host.close()


def test_plan_check_understands_a_servers_port():
    def problems(body: str, vars_: str = "") -> list[str]:
        text = f'[plan]\nname = "p"\n[vars]\n{vars_}\n{body}'
        return lint_plan(parse_plan(text, "p.toml"), text, "p.toml")

    srv = '[[stage]]\nid = "{id}"\nkind = "server"\nport = {port}\ncommand = "serve"\n'
    assert problems(srv.format(id="a", port='"${port}"'), 'port = "8123"') == []
    assert problems(srv.format(id="a", port='"${port}"'), 'port = "http"') == [
        "p.toml:8: stage 'a': port is \"http\" (from \"${port}\"): expected a TCP port, 1 to 65535"]
    two = problems(srv.format(id="a", port=8000) + srv.format(id="b", port='"${p}"'), 'p = "8000"')
    assert two == ["p.toml:13: stage 'b': port 8000 is stage 'a' port too: two servers cannot listen on one"]
    for bad, why in (("0", "a TCP port"), ("true", "a TCP port"), ('"80a"', "a TCP port")):
        with pytest.raises(PlanError, match=why):
            parse_plan(f'[plan]\nname = "p"\n{srv.format(id="a", port=bad)}', "p.toml")
    with pytest.raises(PlanError, match="port is for a server stage"):
        parse_plan('[plan]\nname = "p"\n[[stage]]\nid = "j"\nport = 80\ncommand = "x"\n', "p.toml")


def test_the_bundled_plans_declare_their_servers_ports():
    from ops.paths import ASSETS
    from ops.plan.parse import load_plan
    from ops.plan.records import StageKind

    for f in sorted((ASSETS / "plans").glob("*.toml")):
        plan = load_plan(f)
        servers = [s for s in plan.stages if s.kind is StageKind.SERVER]
        assert servers and all(s.port for s in servers), f
        assert lint_plan(plan, f.read_text(), str(f)) == []

"""Two of everything (issue 39, items 4 and 5): the demo takes a free port for its server and keeps it in its
workspace, so a second demo beside a running one gets its own; a resumed demo keeps what verified and retries
what failed, saying so."""

from __future__ import annotations

import shutil
import socket
import time
import tomllib
import uuid

import pytest

from cli.main import main
from ops import demo, workspace
from ops.node_handle import NodeHandles
from ops.nodes import load_nodes
from ops.plan.parse import load_plan
from ops.plan.resolve import apply_overrides
from ops.run.scheduler import Scheduler
from ops.run.views import StageState as S
from ops.state import StateStore
from tests.support.sshd import free_port
from tests.support.tiny import tiny_target_dir
from tests.support.tmux_sessions import kill_plan_sessions
from tests.test_plan_scheduler import run_until


def recorded_vars(work) -> dict[str, str]:
    return tomllib.loads((work / "nodedeck.toml").read_text()).get("vars", {})


def test_the_demo_takes_a_free_port_and_keeps_it(tmp_path):
    said: list[str] = []
    setup = demo.prepare(tmp_path / "work", fresh=False, say=said.append)
    port = setup.plan_vars["port"]
    assert port.isdigit() and port != "8123" and recorded_vars(setup.work) == {"port": port}
    assert load_nodes(setup.config)["local"].metrics_url == (f"http://127.0.0.1:{port}/metrics",)
    assert workspace.current().vars == {"port": port}   # `nodedeck --work DIR plan ...` sees the same port
    assert demo.prepare(setup.work, fresh=False, say=said.append).plan_vars["port"] == port   # free: kept

    with socket.socket() as holder:                       # another process takes it while the demo is away
        holder.bind(("127.0.0.1", int(port)))
        holder.listen(1)
        again = demo.prepare(setup.work, fresh=False, say=said.append)
    moved = again.plan_vars["port"]
    assert moved != port and recorded_vars(setup.work) == {"port": moved}
    assert any(f"port {port} is in use by pid" in m and f"moves to port {moved}" in m for m in said), said


def test_a_demo_dir_of_an_older_nodedeck_keeps_the_plans_port(tmp_path, monkeypatch):
    """It recorded no port: its server, maybe still up, listens on the plan's own, which the resumed demo keeps."""
    default = str(free_port())
    plan = tmp_path / "demo.toml"
    plan.write_text(RESUMABLE.replace("NAME", "older").replace("GATE", "/nowhere").replace('"8123"', f'"{default}"'))
    monkeypatch.setattr(demo, "DEMO_PLAN", plan)
    setup = demo.prepare(tmp_path / "work", fresh=False, say=lambda m: None)
    assert setup.plan_vars["port"] != default                     # a new demo dir: the kernel's pick
    workspace.write(setup.work, nodes="nodes.toml", state="state")   # as an older nodedeck wrote it
    assert demo.prepare(setup.work, fresh=False, say=lambda m: None).plan_vars["port"] == default


def serving(res):
    return next(v for v in res.views if v.id == "serve_target")


@pytest.mark.timeout(600)
def test_a_second_demo_beside_a_first_ones_running_server(tmp_path):
    """Two demos in two work dirs: the first one's server runs; the second one's comes up beside it, on
    another port, its checks answered by its own process."""
    scheds: list[tuple[Scheduler, NodeHandles]] = []
    try:
        ports = []
        for name in ("first", "second"):
            setup = demo.prepare(tmp_path / name, fresh=False, say=lambda m: None)
            shutil.copytree(tiny_target_dir(), setup.work / "demo" / "model")
            nodes = NodeHandles(setup.config)
            sched = Scheduler(apply_overrides(load_plan(setup.plan), setup.plan_vars), nodes, node_name="local",
                              server_check_interval=0.2)
            scheds.append((sched, nodes))
            for stage in ("prep_native", "tiny_model"):
                sched.skip(stage)                         # the model is there already
            sched.tick()
            sched.start("serve_target")
            res, _ = run_until(sched, lambda r: serving(r).state.terminal, timeout=300)
            view = serving(res)
            assert view.state is S.COMPLETED and all(c.ok for c in view.checks), (view.detail, view.checks)
            ports.append(setup.plan_vars["port"])
        assert ports[0] != ports[1]
        time.sleep(1)                                     # a server that could not listen has exited by now
        both = [serving(sched.tick()) for sched, _ in scheds]
        assert all(v.state is S.COMPLETED and v.ended_at is None and all(c.ok for c in v.checks) for v in both), both
    finally:
        for sched, nodes in scheds:
            demo.stop_servers(sched, say=lambda m: None)
            nodes.close()
        kill_plan_sessions("demo")


RESUMABLE = '''
[plan]
name = "NAME"
node = "local"
[vars]
port = "8123"
gate = "GATE"
[[stage]]
id = "made"
command = "echo made >> made.txt"
outputs = ["made.txt"]
[[stage]]
id = "srv"
kind = "server"
port = "${port}"
depends_on = ["made"]
command = "test -f ${gate} || { echo no gate: ${gate}; exit 3; }; exec python3 -m http.server ${port} --bind 127.0.0.1"
verify = [{ kind = "http_ok", url = "http://127.0.0.1:${port}/", timeout = 2 }]
[[stage]]
id = "use"
depends_on = ["srv"]
command = "curl -sf http://127.0.0.1:${port}/ > page.html"
outputs = ["page.html"]
'''


def test_a_resumed_demo_keeps_what_verified_and_retries_what_failed(tmp_path, monkeypatch, capsys):
    name = f"r{uuid.uuid4().hex[:8]}"
    gate = tmp_path / "gate"
    plan = tmp_path / "demo.toml"
    plan.write_text(RESUMABLE.replace("NAME", name).replace("GATE", str(gate)))
    monkeypatch.setattr(demo, "DEMO_PLAN", plan)
    work = tmp_path / "work"
    argv = ["demo", "--headless", "--engine", "standin", "--work", str(work)]
    try:
        assert main(argv) == 1
        out = capsys.readouterr().out
        assert "demo FAILED: 1/3 stages verified" in out, out
        assert f"srv [failed]: server exited with status 3: no gate: {gate}" in out, out

        gate.write_text("")
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "demo verified: 3/3 stages verified" in out, out
        assert "1 verified stage kept" in out and "retrying srv (server exited with status 3" in out, out
        assert (work / "made.txt").read_text() == "made\n"          # verified once: not run again
        store = StateStore(work / "state" / "nodedeck" / "nodes" / "local.sqlite")
        try:
            assert len(store.runs_for_stage(f"{name}/made")) == 1 and len(store.runs_for_stage(f"{name}/srv")) == 2
        finally:
            store.close()
    finally:
        kill_plan_sessions(name)

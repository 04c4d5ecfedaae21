"""A stage on several nodes: `local` and the loopback sshd node (same user, same machine, two roots), one
torchrun node-rank each, shown and settled as one stage; and the real `nodedeck-train train` across them."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from cli.main import main
from ops.errors import UserError
from ops.node_handle import NodeHandles
from ops.plan.parse import PlanError, parse_plan
from ops.run.ranks import Rendezvous, torchrun_command
from ops.run.scheduler import Scheduler
from ops.run.views import StageState as S
from tests.support.tmux_sessions import kill_plan_sessions
from tui.live import LiveSource

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


# -- the plan file ------------------------------------------------------------------------
def _errors(text: str) -> list[str]:
    with pytest.raises(PlanError) as ei:
        parse_plan(text, "p.toml")
    return ei.value.errors


@pytest.mark.parametrize("body,line,fragment", [
    ('node = "a"\nnodes = ["b", "c"]\n', 5, "give node or nodes, not both"),
    ('nodes = ["b"]\n', 4, "two or more different nodes"),
    ('nodes = ["b", "b"]\n', 4, "two or more different nodes"),
    ('nodes = ["b", "no spaces"]\n', 4, "an array of node names"),
    ('nodes = ["b", "c"]\nkind = "server"\n', 4, "nodes is for jobs"),
    ('nproc_per_node = 2\n', 4, "nproc_per_node is for a stage with nodes"),
    ('rdzv_host = "10.0.0.1"\n', 4, "rdzv_host is for a stage with nodes"),
    ('nodes = ["b", "c"]\nnproc_per_node = "many"\n', 5, "nproc_per_node must be a whole number >= 1 or one of"),
    ('nodes = ["b", "c"]\nnproc_per_node = 0\n', 5, "nproc_per_node must be"),
    ('nodes = ["b", "c"]\nrdzv_host = "${nope}"\n', 5, "unknown variable ${nope}"),
])
def test_nodes_errors_name_file_and_line(body, line, fragment):
    errs = _errors(f'[[stage]]\nid = "a"\ncommand = "x"\n{body}')
    assert any(e.startswith(f"p.toml:{line}: stage 'a': ") and fragment in e for e in errs), errs


def test_nodes_parse():
    plan = parse_plan('[vars]\nhead = "10.0.0.1"\n[[stage]]\nid = "a"\ncommand = "x"\nnodes = ["gpu1", "gpu2"]\n'
                      'nproc_per_node = "gpu"\nrdzv_host = "${head}"\n[[stage]]\nid = "b"\ncommand = "x"\n'
                      'nodes = ["gpu2", "gpu1", "gpu3"]\nnproc_per_node = 2\n', "p.toml")
    a, b = plan.stages
    assert (a.nodes, a.nproc_per_node, a.rdzv_host, a.node) == (("gpu1", "gpu2"), "gpu", "${head}", None)
    assert (b.nodes, b.nproc_per_node, b.rdzv_host) == (("gpu2", "gpu1", "gpu3"), "2", None)


def test_plan_check_names_unknown_nodes_and_a_torchrun_command(tmp_path, capsys):
    cfg = tmp_path / "nodes.toml"
    cfg.write_text('[nodes.gpu1]\nssh = "gpu1"\n[nodes.gpu2]\nssh = "gpu2"\nport = "22"\n')
    plan = tmp_path / "p.toml"
    plan.write_text('[[stage]]\nid = "a"\ncommand = "nodedeck-train train --out x"\nnodes = ["gpu1", "gpu3"]\n'
                    '[[stage]]\nid = "b"\nnodes = ["local", "gpu2"]\n'
                    'command = "CUDA_VISIBLE_DEVICES=0 torchrun --nproc-per-node 2 --no-python nodedeck-train train"\n')
    assert main(["--config", str(cfg), "plan", "check", str(plan)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert f"nodedeck: {plan}:4: stage 'a': nodes: unknown node 'gpu3' (known: gpu1, local)" in err
    assert any(line.startswith(f"nodedeck: {plan}:7: stage 'b': nodes: {cfg}:5: nodes.gpu2.port") for line in err), err
    assert any(line.startswith(f"nodedeck: {plan}:8: stage 'b': a stage with nodes runs its command under torchrun")
               for line in err), err
    cfg.write_text('[nodes.gpu1]\nssh = "gpu1"\n[nodes.gpu3]\nssh = "gpu3"\n')
    plan.write_text('[[stage]]\nid = "a"\ncommand = "nodedeck-train train --out x"\nnodes = ["gpu1", "gpu3"]\n')
    assert main(["--config", str(cfg), "plan", "check", str(plan)]) == 0


def test_torchrun_line_keeps_the_command_whole():
    line = torchrun_command("echo \"$RANK\" '$$' ${local_rank} > out", Rendezvous("10.0.0.1", 29500, 2, "gpu"), 1)
    assert line == ("torchrun --nnodes 2 --node-rank 1 --nproc-per-node gpu --master-addr 10.0.0.1 --master-port 29500 "
                    "--no-python bash -c 'echo \"$$RANK\" '\"'\"'$$$$'\"'\"' $${local_rank} > out'")
    # what torchrun hands bash: its string.Template pass turns every $$ back into $
    from string import Template
    assert Template("echo \"$$RANK\" '$$$$' $${local_rank} > out").safe_substitute(local_rank="0") == \
        "echo \"$RANK\" '$$' ${local_rank} > out"


def test_the_first_nodes_address_for_the_others(tmp_path):
    from ops.node_handle import NodeHandle

    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text("Host gpu1\n  HostName 10.1.2.3\n  User me\n")
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.gpu1]\nssh = "gpu1"\nssh_config = "{ssh_config}"\n'
                   f'[nodes.gpu2]\nssh = "gpu1"\nssh_config = "{ssh_config}"\nrdzv_host = "gpu2.cluster"\n'
                   '[nodes.local]\nrdzv_host = "192.168.1.5"\n')
    found = {}
    for name in ("gpu1", "gpu2", "local"):
        with NodeHandle.open(name, cfg) as node:   # nothing connects: the ssh config is only read
            found[name] = node.rdzv_host
    assert found == {"gpu1": "10.1.2.3", "gpu2": "gpu2.cluster", "local": "192.168.1.5"}
    with NodeHandle.open("local") as node:   # no nodes.toml: local with its defaults
        assert node.rdzv_host == "127.0.0.1"


# -- on two nodes ---------------------------------------------------------------------------
@pytest.fixture
def two_nodes(tmp_path, sshd):
    """nodes.toml with `local` and `testnode` (the loopback sshd: the same machine, so another root)."""
    roots = {"local": tmp_path / "local-root", "testnode": tmp_path / "ssh-root"}
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{roots["local"]}"\n[nodes.testnode]\nssh = "testnode"\n'
                   f'ssh_config = "{sshd.ssh_config}"\nroot = "{roots["testnode"]}"\nconnect_timeout = 5\n')
    marker = f"nd-mn-{uuid.uuid4().hex[:8]}"
    yield cfg, roots, marker
    _kill_marked(marker)


def _marked(marker: str) -> list[int]:
    """PIDs of this test's processes: their command line holds its marker."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def _kill_marked(marker: str) -> None:
    for pid in _marked(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _plan_text(name: str, command: str | list[str], extra: str = "") -> str:
    path = f"{BIN}:/usr/local/bin:/usr/bin:/bin"
    return (f'[plan]\nname = "{name}"\nenv = {{ PATH = "{path}", PYTHONPATH = "{REPO}", OMP_NUM_THREADS = "1" }}\n'
            f'[[stage]]\nid = "job"\nnodes = ["local", "testnode"]\ncommand = {json.dumps(command)}\n{extra}')


def _until(sched: Scheduler, pred, timeout: float = 90):
    end = time.monotonic() + timeout
    while True:
        res = sched.tick()
        view = res.views[0]
        if pred(view):
            return view
        assert time.monotonic() < end, f"timed out: {view.state.value}: {view.detail} / {view.ranks_line()}"
        time.sleep(0.3)


def test_one_rank_failing_or_a_timeout_fails_the_stage_and_stops_the_others(two_nodes):
    cfg, roots, marker = two_nodes
    name = f"mn{uuid.uuid4().hex[:8]}"
    command = f'if [ "$RANK" = 1 ]; then echo "rank one gives up on $(hostname)"; exit 3; fi; sleep 120; : {marker}'
    slow = f'[[stage]]\nid = "slow"\nnodes = ["testnode", "local"]\ntimeout = "4s"\ncommand = "sleep 120; : {marker}"\n'
    plan = parse_plan(_plan_text(name, command, slow), "p.toml")
    nodes = NodeHandles(cfg)
    try:
        sched = Scheduler(plan, nodes, auto=True, stop_grace=5)
        end = time.monotonic() + 90
        while not (res := sched.tick()).done:
            assert time.monotonic() < end, [(v.id, v.state.value, v.detail) for v in res.views]
            time.sleep(0.3)
        job, slow_view = res.views
        assert job.state is S.FAILED
        assert job.detail.startswith("node-rank 1 on testnode: exit 1"), job.detail
        assert [(r.node_name, r.node_rank) for r in job.ranks] == [("local", 0), ("testnode", 1)]
        assert job.ranks[0].stopped and job.ranks[1].exit_code == 1 and not job.ranks[1].stopped
        assert job.ranks_line() == "2 nodes: local r0 stopped, testnode r1 exit 1"
        logs = [p for p in (roots["testnode"] / ".nodedeck" / "runs").glob("*.log") if "job" in p.name]
        assert len(logs) == 1 and "rank one gives up" in logs[0].read_text()   # node-rank 1's log, on its node
        assert (slow_view.state, slow_view.detail) == (S.FAILED, "timed out after 4s")
        assert slow_view.node_name == "testnode"
        assert slow_view.ranks_line() == "2 nodes: testnode r0 stopped, local r1 stopped"
        deadline = time.monotonic() + 10
        while _marked(marker) and time.monotonic() < deadline:   # the workers went with their torchruns
            time.sleep(0.2)
        assert _marked(marker) == []
        stops = [e.message for e in _events(sched) if e.kind == "plan.stop"]
        assert any("stopped the node-ranks still running: local r0: " in m for m in stops), stops
    finally:
        nodes.close()
        kill_plan_sessions(name)


def test_an_unreachable_node_launches_no_rank(two_nodes, sshd):
    cfg, roots, marker = two_nodes
    name = f"mn{uuid.uuid4().hex[:8]}"
    plan = parse_plan(_plan_text(name, f"sleep 120; : {marker}"), "p.toml")
    sshd.stop()
    nodes = NodeHandles(cfg)
    try:
        sched = Scheduler(plan, nodes, auto=True)
        res = sched.tick()
        assert res.views[0].state is S.READY and not res.done
        assert any("not launched, a node of local, testnode unreachable: testnode (127.0.0.1:" in e.message
                   for e in res.events), res.events
        # node-rank 0 (on local) starts last: nothing ran, nothing is recorded on the first node
        assert sched.ctx.handle(plan.stages[0]).store.latest_run(sched.ctx.run_key(plan.stages[0])) is None
        assert _marked(marker) == []
    finally:
        nodes.close()
        kill_plan_sessions(name)


def _events(sched: Scheduler):
    return sched.ctx.handle(sched.plan.stages[0]).store.events(limit=200)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_stop_stops_every_rank_by_its_pid_and_show_lists_them(two_nodes, capsys):
    cfg, roots, marker = two_nodes
    name = f"mn{uuid.uuid4().hex[:8]}"
    plan_file = roots["local"].parent / "p.toml"
    rdzv = 'rdzv_host = "${head}"\n[vars]\nhead = "localhost"\n'   # the first node's address, from a variable
    command = f'echo "node-rank $GROUP_RANK of job"; sleep 300; : {marker}'   # the marker last: bash stays
    plan_file.write_text(_plan_text(name, command, rdzv))
    nodes = NodeHandles(cfg)
    try:
        from ops.plan.parse import load_plan

        sched = Scheduler(load_plan(plan_file), nodes)
        view = sched.start("job")
        view = _until(sched, lambda v: v.state is S.RUNNING and all(r.state == "running" for r in v.ranks))
        assert view.node_name == "local" and view.detail.startswith("2 nodes, up ")
        launch = sched.ctx.record(sched.plan.stages[0]).launch
        commands = [nodes(r.node_name).store.get_run(r.run).command for r in launch.ranks]
        assert [c.split()[:9] for c in commands] == [
            ["torchrun", "--nnodes", "2", "--node-rank", str(r), "--nproc-per-node", "1", "--master-addr",
             "localhost"] for r in (0, 1)]
        pids = [r.pid for r in view.ranks]
        assert view.ranks_line() == f"2 nodes: local r0 running (pid {pids[0]}), testnode r1 running (pid {pids[1]})"
        assert main(["--config", str(cfg), "plan", "show", str(plan_file), "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)["stages"][0]
        assert shown["state"] == "running" and [(r["node"], r["state"]) for r in shown["ranks"]] == [
            ("local", "running"), ("testnode", "running")]
        assert main(["--config", str(cfg), "plan", "show", str(plan_file)]) == 0
        assert view.ranks_line() in capsys.readouterr().out
        with pytest.raises(UserError, match="already running"):
            sched.start("job")
        dashboard = LiveSource(config_path=cfg, plan_path=plan_file, timeout=5)   # the TUI's confirmation
        try:
            dashboard.poll_plan()
            target = dashboard.stop_target("job")
            assert (target.pid, target.other_ranks) == (pids[0], (f"testnode r1 running (pid {pids[1]})",))
        finally:
            dashboard.close()
        _each_rank_has_its_log(cfg, plan_file, capsys)
        deadline = time.monotonic() + 60
        while len(_marked(marker)) < 4:   # both torchruns (2) started their worker (bash -c: 2)
            assert time.monotonic() < deadline, _marked(marker)
            time.sleep(0.2)
        view = sched.stop("job", grace=5)
        assert view.state is S.FAILED and view.detail == "stopped by user"
        assert all(r.stopped for r in view.ranks)
        for pid in pids:   # signalled and gone (a loaded machine may take a moment to reap them)
            gone_by = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < gone_by:
                time.sleep(0.1)
            assert not _alive(pid), f"pid {pid} still alive after stop"
        deadline = time.monotonic() + 10
        while _marked(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _marked(marker) == []   # torchrun's workers (their own sessions) went with it
    finally:
        nodes.close()
        kill_plan_sessions(name)


def _each_rank_has_its_log(cfg, plan_file, capsys) -> None:
    """`stage logs --node-rank R` and the dashboard's log screen read rank R's log on its own node."""
    args = ["--config", str(cfg), "stage", "logs", "job", "--plan", str(plan_file), "--json"]
    for rank, node in ((0, "local"), (1, "testnode")):
        deadline = time.monotonic() + 60
        while True:
            assert main([*args, "--node-rank", str(rank)]) in (0, 1)
            shown = json.loads(capsys.readouterr().out)
            if f"node-rank {rank} of job" in shown["text"]:
                break
            assert time.monotonic() < deadline, shown
            time.sleep(0.3)
        assert (shown["node"], shown["node_rank"]) == (node, rank)
        assert f"node-rank {1 - rank} of job" not in shown["text"]
    assert main([*args, "--node-rank", "2"]) == 2
    assert "stage 'job' has no node-rank 2: its latest run has node-ranks 0-1" in capsys.readouterr().err
    assert main(["--config", str(cfg), "stage", "attach", "job", "--plan", str(plan_file), "--json",
                 "--node-rank", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["node"] == "testnode"
    dashboard = LiveSource(config_path=cfg, plan_path=plan_file, timeout=5)
    try:
        dashboard.poll_plan()
        tail = dashboard.open_log("job", 1)
        deadline = time.monotonic() + 30
        while "node-rank 1 of job" not in "\n".join(tail.poll().lines):
            assert time.monotonic() < deadline
            time.sleep(0.3)
        assert "ssh-root" in tail.path   # the second node's root, not the first's
        assert dashboard.attach_command("job", 1).node == "testnode"   # the log screen's `a` on rank 1
    finally:
        dashboard.close()


@pytest.mark.slow
def test_nodedeck_train_on_local_and_the_sshd_node(two_nodes, tmp_path, capsys):
    """The real trainer, one rank per node over gloo: both ranks finish with the same weights; the results
    and the checkpoint are on the first node only, and the stage verifies there."""
    from tests.test_train_multinode import make_tiny
    from trainer.checkpoint import drafter_from_checkpoint
    from trainer.distributed import weights_sha256

    cfg, roots, _ = two_nodes
    data = make_tiny(tmp_path / "data")
    name = f"mn{uuid.uuid4().hex[:8]}"
    command = ["nodedeck-train", "train", "--mode", "eagle3", "--target", f"{data}/target",
               "--vocab", f"{data}/vocab.safetensors", "--hidden-states", f"{data}/hs", "--out", "${root}/out",
               "--batch-size", "2", "--max-steps", "2", "--ttt-length", "2", "--num-workers", "0", "--device", "cpu",
               "--dist-timeout", "60"]
    plan_file = tmp_path / "train.toml"
    check = '{ kind = "json_field", path = "out/done.json", field = "world_size", op = "==", value = 2 }'
    plan_file.write_text(_plan_text(name, command, f'timeout = "5m"\nverify = [{check}]\n'))
    try:
        assert main(["--config", str(cfg), "plan", "run", str(plan_file), "--poll", "0.5", "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert main(["--config", str(cfg), "stage", "verify", "job", "--plan", str(plan_file), "--json"]) == 0
        again = json.loads(capsys.readouterr().out)   # verified again: every rank exited 0, the check passes
        assert again["state"] == "completed" and again["detail"] == "verified: 1 checks pass"
    finally:
        kill_plan_sessions(name)
    stage = result["stages"][0]
    assert result["ok"] and stage["state"] == "completed", stage
    assert [(r["node"], r["state"], r["exit_code"]) for r in stage["ranks"]] == [
        ("local", "exited", 0), ("testnode", "exited", 0)]
    out = roots["local"] / "out"
    done = json.loads((out / "done.json").read_text())
    assert done["world_size"] == 2 and done["steps"] == 2
    assert not (roots["testnode"] / "out").exists()   # rank 1 writes nothing: the nodes need not share a disk
    # each rank hashed its own copy of the final weights; rank 0's is the checkpoint's
    digests = done["replica_sha256"]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert weights_sha256(drafter_from_checkpoint(out)[0]) == digests[0]

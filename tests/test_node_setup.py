"""`nodedeck node setup NODE` against the loopback sshd: a venv that keeps the node's own CUDA torch,
this nodedeck's wheel, a wheelhouse installed with --no-index, the recorded trainer, and a second
run that only checks."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from cli.main import main
from ops.hosts.local import LocalHost
from ops.node_handle import NodeHandle
from ops.setup.probe import _facts, probe
from ops.setup.record import TrainerSetup, recorded, save
from ops.setup.wheel import repack, version_string
from ops.state import StateStore
from tests.support.node_env import FAKE_TORCH, make_userbase, start_sshd, tiny_wheel
from tests.support.sshd import sshd_available
from trainer.capture_sglang import NODE_STACK


@pytest.fixture
def node(tmp_path):
    """A node `gpu1` (the loopback sshd) whose python sees the fake CUDA torch as a system package; the
    trainer's requirements are all there but prometheus_client, which comes from the wheelhouse."""
    if not sshd_available():
        pytest.fail("/usr/sbin/sshd is missing: run `make system-tools` as root")
    userbase = tmp_path / "node-system"
    site_dir = make_userbase(userbase, leave_out=("prometheus_client",))
    server = start_sshd(tmp_path / "sshd", userbase)
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.gpu1]\nssh = "testnode"\nssh_config = "{server.ssh_config}"\n'
                   f'root = "{tmp_path / "work"}"\n')
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    repack("prometheus_client", wheelhouse)
    yield cfg, wheelhouse, site_dir, tmp_path / "work"
    server.stop()


def _setup(cfg, *args) -> tuple[int, dict]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["--config", str(cfg), "node", "setup", "gpu1", "--json", *args])
    return rc, json.loads(out.getvalue())


def _run_on_node(cfg, *argv) -> str:
    with NodeHandle.open("gpu1", cfg) as handle:
        return handle.host.run(list(argv), timeout=120).check().text


def test_setup_keeps_the_nodes_cuda_torch_installs_from_the_wheelhouse_and_resumes(node, tmp_path, capsys):
    cfg, wheelhouse, site_dir, work = node
    # a wheelhouse without prometheus_client: the setup stops at the dependencies, one line, nothing recorded
    wrong = tmp_path / "other-wheels"
    wrong.mkdir()
    (wrong / "unrelated-1.0-py3-none-any.whl").write_bytes(b"PK")
    rc, res = _setup(cfg, "--wheelhouse", str(wrong))
    steps = {s["step"]: s for s in res["steps"]}
    last = res["steps"][-1]
    assert rc == 1 and not res["ok"] and res["setup"] is None and recorded("gpu1") is None
    assert last["step"] == "dependencies" and last["status"] == "failed", res["steps"]
    assert "prometheus" in last["detail"] and "\n" not in last["detail"]
    assert steps["torch"]["detail"].startswith(f"torch {FAKE_TORCH}, CUDA 13.0 from {site_dir}/torch/")
    assert steps["gpus"]["status"] == "warning" and "no GPUs" in steps["gpus"]["detail"]

    # the right wheelhouse: the setup resumes (the venv, the pushed wheel and its install are kept)
    rc, res = _setup(cfg, "--wheelhouse", str(wheelhouse))
    steps = {s["step"]: s for s in res["steps"]}
    assert rc == 0 and res["ok"], res["steps"]
    assert [steps[s]["status"] for s in ("environment", "wheel", "install")] == ["skipped"] * 3
    assert steps["wheelhouse"]["detail"].startswith("pushed 1 of 1 files")
    assert steps["dependencies"]["detail"] == \
        "nodedeck[trainer]: installed 1 package from the wheelhouse only (--no-index)"
    assert steps["torch after"]["detail"].endswith("(kept)")
    assert res["steps"][-1]["step"] == "record"
    env = work / ".nodedeck" / "venv"
    assert res["setup"]["bin_dir"] == str(env / "bin") and res["setup"]["version"] == version_string()
    assert res["setup"]["torch"] == FAKE_TORCH

    # the environment imports the node's own torch, and the trainer this machine built
    said = _run_on_node(cfg, str(env / "bin" / "python"), "-c",
                        "import torch, prometheus_client as p; print(torch.__version__, torch.__file__, p.__file__)")
    version, torch_file, prom = said.split()
    assert version == FAKE_TORCH and torch_file == str(site_dir / "torch" / "__init__.py")
    assert prom.startswith(str(env))
    assert _run_on_node(cfg, str(env / "bin" / "nodedeck-train"), "--version").strip() == \
        f"nodedeck-train {version_string()}"
    rec = recorded("gpu1")
    assert rec is not None and rec.bin_dir == str(env / "bin")
    capsys.readouterr()

    assert main(["--config", str(cfg), "nodes", "--check", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["gpu1"]["trainer"] == version_string() and rows["gpu1"]["trainer_warning"] is None
    assert rows["local"]["trainer"] is None and rows["local"]["trainer_warning"] is None

    # the node stack wants another torch (a CPU 2.13.0 in the wheelhouse): the node's torch is held, so pip
    # refuses and the setup fails saying why; the environment still imports the node's CUDA torch
    conflict = tmp_path / "conflict-wheels"
    conflict.mkdir()
    tiny_wheel(conflict, "torch", "2.13.0")
    tiny_wheel(conflict, "sglang", NODE_STACK["sglang"], requires=("torch==2.13.0",))
    for name in ("specforge", "transformers"):   # the rest of the pinned node stack, so that torch is what clashes
        tiny_wheel(conflict, name, NODE_STACK[name])
    rc, res = _setup(cfg, "--wheelhouse", str(conflict), "--with-node-stack")
    last = res["steps"][-1]
    assert rc == 1 and (last["step"], last["status"]) == ("dependencies", "failed"), res["steps"]
    assert last["detail"].startswith("pip install failed: ERROR: ") and "conflict" in last["detail"]
    said = _run_on_node(cfg, str(env / "bin" / "python"), "-c",
                        "import torch; print(torch.__version__, torch.__file__)")
    assert said.split() == [FAKE_TORCH, str(site_dir / "torch" / "__init__.py")]
    assert recorded("gpu1") == rec     # the last good setup stays recorded


def test_probe_output_from_a_hostile_nvidia_smi_is_made_printable(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text("#!/bin/sh\n"
                   'if [ $# -gt 0 ]; then printf "NVIDIA \\033]0;owned\\007H100\\033[2J, 550.54, 81559\\n"; '
                   'else echo "| NVIDIA-SMI 550.54   Driver Version: 550.54   CUDA Version: 12.4 |"; fi\n')
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    import sys

    facts = probe(LocalHost(), sys.executable, str(tmp_path))
    assert facts.cuda == "12.4" and len(facts.gpus or ()) == 1
    gpu = (facts.gpus or ())[0]
    assert "\x1b" not in gpu.name and "\x07" not in gpu.name and gpu.name.startswith("NVIDIA \\x1b]0;owned\\x07H100")
    assert (gpu.driver, gpu.memory_mib) == ("550.54", 81559)
    odd = _facts({"python": ["3", 11, 2], "gpus": [1, "\u202eevil, 1, x"], "disk": "full"})
    assert odd.python == (0, 0, 0) and odd.disk_free is None and odd.gpus is not None
    assert odd.gpus[0].name == "\\u202eevil" and odd.gpus[0].memory_mib is None


def test_nodes_check_warns_when_the_nodes_trainer_is_another_build(tmp_path, capsys):
    bin_dir = tmp_path / "env" / "bin"
    bin_dir.mkdir(parents=True)
    trainer = bin_dir / "nodedeck-train"
    trainer.write_text("#!/bin/sh\nprintf 'nodedeck-train 0.0.9 (build 000000000000)\\033[2J\\n'\n")
    trainer.chmod(0o755)
    store = StateStore.for_node("local")
    save(store, TrainerSetup(python=str(bin_dir / "python"), bin_dir=str(bin_dir), version="0.0.9"))
    store.close()
    assert main(["nodes", "--check"]) == 0
    out = capsys.readouterr()
    assert "0.0.9 (build 000000000000)\\x1b[2J" in out.out and "\x1b" not in out.out + out.err
    assert out.err.strip() == (f"nodedeck: warning: local: the node's trainer is 0.0.9 (build 000000000000)\\x1b[2J, "
                               f"this nodedeck is {version_string()}: run `nodedeck node setup local`")


PLANS = Path(__file__).resolve().parent.parent / "assets" / "plans"


def test_plan_check_says_which_nodes_have_no_trainer_before_anything_launches(tmp_path, capsys):
    cfg = tmp_path / "nodes.toml"
    cfg.write_text('[nodes.gpu1]\nssh = "gpu1"\n')
    demo_plan, eagle = str(PLANS / "demo.toml"), str(PLANS / "eagle3-sglang.toml")
    assert main(["--config", str(cfg), "plan", "check", demo_plan, "--node", "gpu1"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nodedeck: warning: node gpu1 has no trainer installed by nodedeck "
                                               "(tiny_model, prep_native, prep_prompts and ")
    assert err[0].endswith(f"run nodedeck-train there): run `nodedeck --config {cfg} node setup gpu1`")
    # a trainer named by --var is the user's choice: nothing to say
    assert main(["--config", str(cfg), "plan", "check", demo_plan, "--node", "gpu1",
                 "--var", "train=/opt/env/bin/nodedeck-train"]) == 0
    assert capsys.readouterr().err == ""
    # the bundled plans write nodedeck-train itself; after a setup, no warning
    assert main(["--config", str(cfg), "plan", "check", eagle, "--node", "gpu1"]) == 0   # gpu1 cannot be probed
    err = capsys.readouterr().err
    assert "node gpu1 has no trainer" in err and "warning: gpu1 not probed" in err
    store = StateStore.for_node("gpu1")
    save(store, TrainerSetup(python="/w/.nodedeck/venv/bin/python", bin_dir="/w/.nodedeck/venv/bin", version="x"))
    store.close()
    assert main(["--config", str(cfg), "plan", "check", demo_plan, eagle, "--node", "gpu1"]) == 0
    assert "no trainer" not in capsys.readouterr().err


def test_a_stage_on_a_set_up_node_gets_the_trainer_first_on_its_path(tmp_path):
    from ops.node_handle import NodeHandles
    from ops.plan.parse import load_plan
    from ops.run.scheduler import Scheduler

    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{tmp_path / "work"}"\n')
    plan = load_plan(PLANS / "demo.toml")
    nodes = NodeHandles(cfg)
    try:
        sched = Scheduler(plan, nodes, node_name="local")
        assert sched.ctx.environment(plan.stage("prep_native"))[1] == []
        store = StateStore.for_node("local")
        save(store, TrainerSetup(python="/n d/bin/python", bin_dir="/n d/bin", version="x"))
        store.close()
        assert sched.ctx.environment(plan.stage("prep_native"))[1] == ["export PATH='/n d/bin':\"$PATH\""]
    finally:
        nodes.close()


def test_setup_of_local_records_this_nodedecks_trainer_and_refuses_remote_options(capsys):
    assert main(["node", "setup", "local", "--with-node-stack"]) == 2
    assert capsys.readouterr().err.startswith("nodedeck: node local is this machine, whose trainer is this ")
    assert recorded("local") is None
    assert main(["node", "setup", "local"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[1] for ln in out[1:-1]] == ["python", "disk", "gpus", "torch", "verify", "record"]
    assert out[-1].startswith(f"local is ready: plans run nodedeck-train {version_string()} from ")
    assert recorded("local") is not None


def test_an_install_without_its_source_packs_its_own_wheel_again(tmp_path):
    """`pip install .` leaves no checkout: the wheel for the node is packed from the installed files, and
    keeps the build id the first wheel was stamped with."""
    import subprocess
    import sys
    import zipfile

    from ops.setup.wheel import build_wheel, source_dir, source_key

    first = build_wheel()
    key = source_key(source_dir())
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
                    str(first)], check=True, capture_output=True, timeout=300)
    code = ("import sys; from ops.setup.wheel import build_wheel, build_id, source_dir; "
            "assert source_dir() is None; print(build_wheel()); print(build_id())")
    env = {"PYTHONPATH": str(target), "XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code.replace("import sys;", f"import sys; sys.path[:0] = "
                                                                    f"[{str(target)!r}];")],
                         env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    wheel, build = out.stdout.split()
    assert build == key and wheel.startswith(str(tmp_path / "cache"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert {"ops/setup/steps.py", "trainer/build.toml", "assets/plans/demo.toml"} <= names
        assert z.read("trainer/build.toml").decode().strip().endswith(f'source = "{key}"')
        record = z.read("nodedeck-0.1.0.dist-info/RECORD").decode()
    assert "ops/setup/steps.py,sha256=" in record and not any(n.endswith(".pyc") for n in names)


def test_gpus_step_on_what_a_real_h200_node_printed(tmp_path, monkeypatch):
    """nvidia-smi's words as an H200 node printed them (driver 580.159.04, 2026-12-04), replayed."""
    import sys

    from ops.setup.steps import check_gpus

    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\nif [ $# -gt 0 ]; then echo 'NVIDIA H200, 580.159.04, 143771'; exit 0; fi\n"
        "echo '+-----------------------------------------------------------------------------------------+'\n"
        "echo '| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    facts = probe(LocalHost(), sys.executable, str(tmp_path))
    assert check_gpus(facts)[1] == "1 x NVIDIA H200 140 GiB; driver 580.159.04, CUDA 13.0"


def test_the_dashboard_with_a_plan_says_which_nodes_have_no_trainer(tmp_path):
    from tui.live import LiveSource

    cfg = tmp_path / "nodes.toml"
    cfg.write_text('[nodes.gpu1]\nssh = "gpu1"\n')
    source = LiveSource(config_path=cfg, node="gpu1", plan_path=PLANS / "demo.toml", auto=True)
    try:
        lines = source.startup_warnings()
        assert len(lines) == 1 and lines[0].startswith("node gpu1 has no trainer installed by nodedeck (")
        store = StateStore.for_node("gpu1")
        save(store, TrainerSetup(python="/w/venv/bin/python", bin_dir="/w/venv/bin", version="x"))
        store.close()
        assert source.startup_warnings() == []
    finally:
        source.close()


def test_startup_warnings_are_a_lasting_notification_and_an_event():
    import asyncio

    from tests.support.tui_fixed import FixedSource
    from tests.support.tui_screens import Seen, until, wait_polled
    from tui.app import NodedeckApp

    line = "node gpu1 has no trainer installed by nodedeck (train runs nodedeck-train there)\x1b[2J"

    class Warned(FixedSource):
        def startup_warnings(self) -> list[str]:
            return [line]

    async def run() -> None:
        seen = Seen()
        app = NodedeckApp(Warned(), refresh_s=3600)
        async with app.run_test(size=(120, 40), message_hook=seen) as pilot:
            await wait_polled(app, pilot)
            await until(pilot, lambda: "warning node gpu1 has no trainer" in seen.event_text(), 5, "the event")
            notes = [n for n in app._notifications if n.title == "warning"]
            assert len(notes) == 1 and notes[0].severity == "warning" and notes[0].timeout >= 30
            assert notes[0].message.endswith("there)\\x1b[2J") and "\x1b" not in notes[0].message

    asyncio.run(run())

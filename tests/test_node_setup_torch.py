"""Issue 39 item 10: `node setup` on a node without GPUs and without torch says what pip will install, and about
how big, before it installs anything; the package index's torch there is a CUDA build (it comes with nvidia-*
wheels), so it stops and says how to get a CPU build, which `--torch-index URL` then installs.

The node is the loopback sshd; its pip sees only this test's two package indexes (real HTTP, served here): the
default one (PIP_INDEX_URL) whose torch wants two nvidia-* wheels of 3 MiB each, and a CPU one."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cli.main import main
from ops.nodes import get_node, load_nodes, open_host
from ops.setup.record import recorded
from tests.support.node_env import make_userbase, start_sshd, tiny_wheel
from tests.support.sshd import sshd_available

MiB = 1 << 20


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def _index(root: Path):
    """A package index as a directory listing over HTTP (pip reads the links of `<index>/<project>/`)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def node(tmp_path):
    if not sshd_available():
        pytest.fail("/usr/sbin/sshd is missing: run `make system-tools` as root")
    cuda, cpu = tmp_path / "index", tmp_path / "cpu-index"
    for d in ("torch", "nvidia-cublas-cu13", "nvidia-cudnn-cu13"):
        (cuda / d).mkdir(parents=True)
    (cpu / "torch").mkdir(parents=True)
    tiny_wheel(cuda / "torch", "torch", "2.13.0", requires=("nvidia-cublas-cu13==13.0.1", "nvidia-cudnn-cu13==9.1"))
    tiny_wheel(cuda / "nvidia-cublas-cu13", "nvidia_cublas_cu13", "13.0.1", pad=3 * MiB)
    tiny_wheel(cuda / "nvidia-cudnn-cu13", "nvidia_cudnn_cu13", "9.1", pad=3 * MiB)
    tiny_wheel(cpu / "torch", "torch", "2.13.0+cpu")
    with _index(cuda) as default, _index(cpu) as cpu_url:
        userbase = tmp_path / "node-system"
        make_userbase(userbase, leave_out=("torch",), fake_torch=False)   # the trainer's other requirements
        server = start_sshd(tmp_path / "sshd", userbase, {"PIP_CONFIG_FILE": "/dev/null", "PIP_INDEX_URL": default})
        cfg = tmp_path / "nodes.toml"
        work = tmp_path / "work"
        cfg.write_text(f'[nodes.gpu1]\nssh = "testnode"\nssh_config = "{server.ssh_config}"\nroot = "{work}"\n')
        try:
            yield cfg, work, cpu_url
        finally:
            server.stop()


def _setup(cfg: Path, *args: str) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["--config", str(cfg), "node", "setup", "gpu1", "--json", *args])
    return rc, json.loads(out.getvalue())


def _torch_in_env(cfg: Path, work: Path) -> str:
    host = open_host(get_node(load_nodes(cfg), "gpu1"))
    try:
        res = host.run([str(work / ".nodedeck/venv/bin/python"), "-c", "import torch; print(torch.__version__)"],
                       timeout=120)
    finally:
        host.close()
    return res.text.strip() if res.ok else "none"


def test_a_gpu_less_node_is_told_what_would_come_and_gets_a_cpu_torch_when_asked(node):
    cfg, work, cpu_index = node
    rc, res = _setup(cfg)
    steps = {s["step"]: s for s in res["steps"]}
    last = res["steps"][-1]
    assert rc == 1 and (last["step"], last["status"]) == ("plan", "failed"), res["steps"]
    assert "install" not in steps and "dependencies" not in steps
    assert steps["gpus"]["status"] == "warning" and "no GPUs" in steps["gpus"]["detail"]
    said = last["detail"]
    assert said.startswith("pip will install ") and "from the package index" in said, said
    assert "torch 2.13.0 (a CUDA build, with 2 nvidia-* package(s): about 6.0 MiB)" in said, said
    assert "This node has no GPU" in said and "nothing was installed" in said
    assert "--torch-index https://download.pytorch.org/whl/cpu" in said and "--wheelhouse" in said
    assert _torch_in_env(cfg, work) == "none" and recorded("gpu1") is None

    rc, res = _setup(cfg, "--torch-index", cpu_index)
    steps = {s["step"]: s for s in res["steps"]}
    assert rc == 0 and res["ok"], res["steps"]
    assert "torch 2.13.0+cpu (a CPU build)" in steps["plan"]["detail"] and "nvidia" not in steps["plan"]["detail"]
    assert steps["plan"]["detail"].startswith("pip will install ")
    assert _torch_in_env(cfg, work) == "2.13.0+cpu"
    rec = recorded("gpu1")
    assert rec is not None and rec.torch == "2.13.0+cpu"

"""`plan check FILE --node N` probes the node and says what it lacks for the plan (issue 39, item 12: it said
`ok` for eagle3-sglang.toml on a node with no GPU and no SGLang): the GPUs the plan's stages ask for, and the
engines and launchers their commands run, looked for in the environment the stages get.

The node is the loopback sshd. Its sessions' PATH starts with a directory of this test's, where a lying
`nvidia-smi` (two GPUs, or none) and a `torchrun` can be put; SGLang and vLLM are importable nowhere here,
and a fake `sglang` package on the stages' PATH (through the plan's setup line) makes it importable.
"""

from __future__ import annotations

import json
import shlex
import stat
from pathlib import Path

import pytest

from cli.main import main
from ops.paths import ASSETS

TWO_GPUS = """#!/bin/sh
case "$*" in
  *--query-gpu*) printf '%s\\n' "0, GPU-aaaa, NVIDIA H100, 0, 1000, 81559, 30, 70, 700, 1980, Disabled" \\
                  "1, GPU-bbbb, NVIDIA H100, 0, 1000, 81559, 30, 70, 700, 1980, Disabled" ;;
esac
exit 0
"""


@pytest.fixture
def node(tmp_path, sshd):
    bindir = tmp_path / "node-bin"
    bindir.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    sshd.put_first_on_path(bindir, home)
    config = tmp_path / "nodes.toml"
    config.write_text(f'[nodes.gpu1]\nssh = "{sshd.alias}"\nssh_config = "{sshd.ssh_config}"\n'
                      f'root = "{tmp_path / "root"}"\nconnect_timeout = 5\n')
    return config, bindir


def _tool(bindir: Path, name: str, text: str = "#!/bin/sh\nexit 0\n") -> None:
    path = bindir / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _check(capsys, config: Path, plan: Path, *more: str) -> tuple[int, str, str]:
    rc = main(["--config", str(config), "plan", "check", str(plan), "--node", "gpu1", *more])
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_bundled_sglang_plan_on_a_node_without_gpus_or_sglang_is_not_ok(node, capsys):
    config, _bindir = node
    rc, out, err = _check(capsys, config, ASSETS / "plans" / "eagle3-sglang.toml")
    assert rc == 2 and not out.startswith("ok"), out
    lines = err.splitlines()
    gpus = next(line for line in lines if "GPU" in line)
    assert "gpu1 has no GPU" in gpus and "serve_baseline" in gpus and "train" in gpus
    sglang = next(line for line in lines if "sglang" in line and "import" in line)
    assert "serve_baseline" in sglang and "python" in sglang
    assert "node setup gpu1 --with-node-stack" in sglang      # the way to get it, with its context
    assert any("torchrun" in line and "hidden_states" in line for line in lines)


def test_the_demo_plan_needs_nothing_a_cpu_node_lacks(node, capsys):
    config, _bindir = node
    rc, out, err = _check(capsys, config, ASSETS / "plans" / "demo.toml")
    assert rc == 0 and out.startswith("ok: "), err
    assert "GPU" not in err and "import" not in err


def _plan(tmp_path: Path, command: str, env: str = "", setup: str = "") -> Path:
    plan = tmp_path / "p.toml"
    plan.write_text(f'[plan]\nname = "fit"\n{setup}\n[[stage]]\nid = "serve"\ncommand = {json.dumps(command)}\n'
                    f'{env}\n[[stage]]\nid = "local_one"\nnode = "local"\ncommand = "torchrun x"\n')
    return plan


def test_gpus_counted_against_the_indices_asked_for(node, capsys, tmp_path):
    config, bindir = node
    _tool(bindir, "nvidia-smi", TWO_GPUS)
    plan = _plan(tmp_path, "python -m sglang.launch_server --tp-size 2 --port 1",
                 env='env = { CUDA_VISIBLE_DEVICES = "1,3" }')
    rc, out, err = _check(capsys, config, plan)
    assert rc == 2
    [gpus] = [line for line in err.splitlines() if "GPU" in line]
    assert "gpu1 has 2 GPUs" in gpus and "serve" in gpus and "GPU 3" in gpus and "CUDA_VISIBLE_DEVICES=1,3" in gpus
    assert "local_one" not in err        # a stage on another node is not this node's business


def test_an_engine_found_in_the_stages_environment_counts(node, capsys, tmp_path):
    config, bindir = node
    _tool(bindir, "nvidia-smi", TWO_GPUS)
    _tool(bindir, "torchrun")
    site = tmp_path / "stage-site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    setup = f'setup = {json.dumps("export PYTHONPATH=" + shlex.quote(str(site)))}'
    plan = _plan(tmp_path, "python3 -m sglang.launch_server --tp-size 2 --port 1 && torchrun --nproc-per-node gpu "
                           "--no-python true", env='env = { CUDA_VISIBLE_DEVICES = "0,1" }', setup=setup)
    rc, out, err = _check(capsys, config, plan)
    assert rc == 0 and out.startswith("ok: "), err
    plan = _plan(tmp_path, "python3 -m sglang.launch_server --tp-size 2 --port 1 && vllm serve m")
    rc, out, err = _check(capsys, config, plan)
    assert rc == 2
    assert any("sglang" in line for line in err.splitlines())
    assert any("vllm" in line and "PATH" in line for line in err.splitlines())


def test_with_json_what_the_node_lacks_is_among_the_findings(node, capsys, tmp_path):
    """`--node` in both forms (issue 42 item 2): what the node lacks is a finding without a line, beside the
    file's own (an unknown flag here), all in one run."""
    config, _bindir = node
    plan = _plan(tmp_path, "python -m sglang.launch_server --tp-size 2 --port 1 --tp-sise 2")
    rc, out, err = _check(capsys, config, plan, "--json")
    doc = json.loads(out)
    assert rc == 2 and doc["ok"] is False and err == ""
    lines = [(f["line"], f["severity"]) for f in doc["findings"]]
    assert lines[0] == (6, "error") and "unknown flag --tp-sise" in doc["findings"][0]["message"]
    lacks = [f["message"] for f in doc["findings"] if f["line"] is None]
    assert any(m.startswith("gpu1 has no GPU") and "serve" in m for m in lacks), lacks
    assert any("sglang" in m and "import" in m for m in lacks), lacks

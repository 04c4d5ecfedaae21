"""assets/flags/vllm.toml is what the installed vLLM's own parsers accept (regenerated here, compared whole)."""

from __future__ import annotations

import subprocess
import tomllib

import pytest

from ops.paths import ASSETS
from tests.engines.vllm_server import REPO, engine_env

pytestmark = pytest.mark.engines


def test_committed_vllm_table_equals_a_fresh_generation(vllm_py, tmp_path):
    committed = (ASSETS / "flags" / "vllm.toml").read_text()
    date = tomllib.loads(committed)["source"]["generated"]
    out = tmp_path / "vllm.toml"
    r = subprocess.run([str(vllm_py), "tools/flaggen.py", "vllm", "--out", str(out), "--date", date],
                       cwd=REPO, env=engine_env(), capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert out.read_text() == committed


def test_vllm_benchmark_leaves_the_temperature_to_the_server(vllm_py):
    """What `plan check`'s rule for `vllm bench serve` rests on: the installed vLLM's benchmark sends no
    temperature unless given one (the server then samples at the model's default), so a plan names it."""
    probe = ("from vllm.benchmarks.serve import add_cli_args\n"
             "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
             "p = FlexibleArgumentParser(); add_cli_args(p)\n"
             "print(p.parse_args(['--model', 'm']).temperature, p.parse_args(['--model', 'm', '--temperature', '0'])"
             ".temperature)\n")
    r = subprocess.run([str(vllm_py), "-c", probe], cwd=REPO, env=engine_env(), capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["None", "0.0"]

"""The bundled eagle3-vllm.toml's own serve and benchmark commands, run by bash with the engine's `vllm` on PATH,
on the demo's target and EAGLE-3 export (CPU options through the plan's `vllm_args`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from ops.paths import ASSETS
from ops.plan.parse import load_plan
from ops.plan.shelltext import substitute
from tests.engines.vllm_server import engine_env, free_port

pytestmark = [pytest.mark.engines, pytest.mark.timeout(1200)]   # real vLLM servers start in minutes on 2 CPUs


def test_plan_serves_the_drafter_and_benchmarks_it(demo, vllm_py, tmp_path):
    plan = load_plan(ASSETS / "plans" / "eagle3-vllm.toml")
    work = tmp_path / "w"
    (work / "drafter").mkdir(parents=True)
    (work / "drafter" / "final").symlink_to(demo.eagle3)
    (work / "data").mkdir()
    shutil.copy(demo.tokenized.parent / "prep" / "native.jsonl", work / "data" / "train.jsonl")
    values = {**plan.vars, "root": str(tmp_path), "work": str(work), "target": str(demo.target), "tp": "1",
              "draft_port": str(free_port()), "bench_prompts": "6", "bench_concurrency": "2",
              "vllm_args": "--enforce-eager --max-model-len 1024 --dtype float32 --max-num-seqs 4"}

    def value(name: str) -> str:
        return substitute(values[name], value, shell=False)

    def command(stage_id: str) -> str:
        return substitute(plan.stage(stage_id).command, value, shell=True)

    env = engine_env(PATH=f"{vllm_py.parent}:{os.environ['PATH']}")
    prompts = subprocess.run(["bash", "-c", command("bench_prompts")], env=env, capture_output=True, text=True,
                             timeout=120, check=False)
    assert prompts.returncode == 0, prompts.stderr
    log = (tmp_path / "serve.log").open("wb")
    server = subprocess.Popen(["bash", "-c", command("serve_eagle3")], env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        url = f"http://127.0.0.1:{values['draft_port']}/health"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                time.sleep(1)
        assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        assert "Application startup complete" in (tmp_path / "serve.log").read_text()   # the stage's verify
        bench = subprocess.run(["bash", "-c", command("bench_eagle3")], env=env,
                               capture_output=True, text=True, timeout=600, check=False)
        assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
        for check in plan.stage("bench_eagle3").verify:                               # the stage's own checks
            assert check.args["pattern"] in bench.stdout
        result = json.loads((work / "bench" / "eagle3.json").read_text())
        # greedy (the plan's --temperature 0): the trained drafter is accepted, as in the eval (sampled: ~1.01)
        assert result["output_throughput"] > 0 and result["spec_decode_acceptance_length"] > 2.0
        assert result["completed"] == 6
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
        log.close()

"""`nodedeck demo --headless --engine vllm` end to end: the demo resumed on real vLLM (its shared stages kept), its
servers and benchmarks verified, the outcome's acceptance and speedup vLLM's, named from the server's own log,
and no server left running."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import tomllib

import pytest

from tests.engines.conftest import BIN

pytestmark = [pytest.mark.engines, pytest.mark.timeout(1500)]   # two vLLM servers start in minutes on 2 CPUs


def test_headless_demo_on_vllm(demo, vllm_py):
    env = {**os.environ, "NODEDECK_VLLM_PYTHON": str(vllm_py)}
    r = subprocess.run([str(BIN / "nodedeck"), "demo", "--headless", "--json", "--engine", "vllm",
                        "--work", str(demo.work)], capture_output=True, text=True, timeout=1400, env=env, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["engine"] == "vllm"
    states = {s["id"]: s["state"] for s in doc["stages"]}
    assert all(v == "completed" for v in states.values()), states
    assert "serve_target" not in states and {"serve_vllm", "serve_vllm_eagle3", "probe_eagle3",
                                             "bench_eagle3"} <= set(states)
    out = doc["outcome"]
    installed = subprocess.run([str(vllm_py), "-c", "import vllm.version as v; print(v.__version__)"],
                               capture_output=True, text=True, check=True).stdout.strip()
    engine = out["accept_len"]["engine"]                      # as the server's log named it
    assert engine["name"] == "vLLM" and engine["version"].startswith(installed), (engine, installed)
    assert out["accept_len"]["source"] == "stage bench_eagle3"
    assert math.isfinite(out["accept_len"]["value"]) and out["accept_len"]["value"] > 2.0   # greedy, as the eval
    assert out["speedup"]["engine"] == engine and math.isfinite(out["speedup"]["value"])
    assert out["engines"][0] == f"vLLM {engine['version']}"
    # the train-serve side by side: vLLM on the eval's own prompts (the probe) agrees with the eval, prompt by prompt
    probe = next(v for v in out["train_serve"] if v["serving"]["source"] == "stage probe_eagle3")
    assert probe["state"] == "agree" and probe["prompts_parted"]["parted"] == 0, probe["line"]
    assert probe["serving"]["engine"]["name"] == "vLLM" and len(probe["serving"]["per_position"]) == 4
    assert out["eval_acceptance"]["per_position"] == probe["serving"]["per_position"]
    # the servers were stopped by their recorded PIDs: nothing of this demo serves any more (another test's vLLM
    # may serve the same target beside it, on a port of its own)
    ports = tomllib.loads((demo.work / "nodedeck.toml").read_text())["vars"]   # the free ones the demo took
    for port in (ports["port"], ports["draft_port"]):
        alive = subprocess.run(["pgrep", "-f", f"vllm serve {demo.target} .*--port {port}( |$)"],
                               capture_output=True, text=True)
        assert alive.stdout.strip() == "", alive.stdout
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", int(port))) != 0, f"something still listens on {port}"

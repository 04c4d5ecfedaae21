"""The train-serve verdict on the real engine (issue 43 item 3): the demo's EAGLE-3 export broken as users' exports
were (aux layer ids off by one, a vocab map rotated by one draft id) and served by vLLM shows a gap against the eval of
the export as trained, and the verdict names the cause. Each served figure is measured by `nodedeck-train probe` and
judged by `nodedeck plan outcome --json`, as a plan on a node has them. (The export as trained agrees:
test_vllm_eagle3.py, on its module's server.)"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from tests.engines.conftest import BIN
from tests.engines.vllm_server import VllmServer

pytestmark = [pytest.mark.engines, pytest.mark.timeout(1200)]   # real vLLM servers start in minutes on 2 CPUs

K = 4                  # the demo's eval: 6 prompts, 24 new tokens, 4 draft tokens


def shift_aux_ids(export: Path) -> None:
    """vLLM's ids one layer late: the off-by-one of speculators #705."""
    cfg = json.loads((export / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in cfg["eagle_aux_hidden_state_layer_ids"]]
    (export / "config.json").write_text(json.dumps(cfg))


def rotate_d2t(export: Path) -> None:
    """Draft id i drafts what draft id i + 1 stands for (a stale map, speculators PR #1081); t2d left as it was."""
    path = export / "model.safetensors"
    raw = bytearray(path.read_bytes())
    (size,) = struct.unpack("<Q", raw[:8])
    begin, end = (8 + size + x for x in json.loads(raw[8:8 + size])["d2t"]["data_offsets"])
    d2t = struct.unpack(f"<{(end - begin) // 8}q", raw[begin:end])
    mapped = [i + d for i, d in enumerate(d2t)]
    raw[begin:end] = struct.pack(f"<{len(d2t)}q", *(mapped[(i + 1) % len(d2t)] - i for i in range(len(d2t))))
    path.write_bytes(bytes(raw))


def probe(server: VllmServer, tokenized: Path, ev: dict, out: Path) -> None:
    """`nodedeck-train probe` of the server on the eval's prompts (its --data, count and length)."""
    r = subprocess.run([str(BIN / "nodedeck-train"), "probe", "--base-url", server.url, "--data", str(tokenized),
                        "--num-prompts", str(ev["num_prompts"]), "--max-new-tokens", str(ev["max_new_tokens"]),
                        "--out", str(out)], capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def plan_verdict(server: VllmServer, eval_json: Path, work: Path) -> dict:
    """The verdict `nodedeck plan outcome --json` gives for a plan whose server stage runs this server's command,
    its eval stage wrote eval_json (copied into the plan's root, `work`) and its probe stage work/served.json."""
    shutil.copy(eval_json, work / "eval.json")
    command = shlex.join(server.argv)
    (work / "nodes.toml").write_text(f'[nodes.local]\nroot = "{work}"\n')
    plan = work / "plan.toml"
    plan.write_text(
        '[[stage]]\nid = "evaluate"\ncommand = "true"\noutputs = ["eval.json"]\n'
        f'[[stage]]\nid = "serve_eagle3"\nkind = "server"\ncommand = {json.dumps(command)}\n'
        '[[stage]]\nid = "probe_eagle3"\ndepends_on = ["serve_eagle3", "evaluate"]\ncommand = "true"\n'
        'outputs = ["served.json"]\n')
    r = subprocess.run([str(BIN / "nodedeck"), "--config", str(work / "nodes.toml"), "plan", "outcome", str(plan),
                        "--json"], capture_output=True, text=True, timeout=120, check=False)
    doc = json.loads(r.stdout)
    assert r.returncode == (1 if doc["gap"] or doc["slower"] else 0), r.stderr   # (the eval: slower on CPU)
    [verdict] = doc["train_serve"]
    assert verdict["serving"]["engine"]["name"] == "vLLM" and verdict["serving"]["source"] == "stage probe_eagle3"
    assert "the same prompts" in verdict["band"]["why"]          # the probe sent the eval's own prompts
    return verdict


@pytest.mark.parametrize("breaks,cause", [(shift_aux_ids, "aux layer ids"), (rotate_d2t, "d2t/t2d")])
def test_a_broken_export_shows_a_gap_and_the_verdict_names_the_cause(demo, vllm_py, tmp_path, breaks, cause):
    export = tmp_path / "final"
    shutil.copytree(demo.eagle3, export)
    breaks(export)
    ev = json.loads(demo.eval_json.read_text())
    spec = {"method": "eagle3", "model": str(export), "num_speculative_tokens": K}
    with VllmServer(demo.target, tmp_path / "server.log", speculative=spec) as server:
        probe(server, demo.tokenized, ev, tmp_path / "plan" / "served.json")
        page = server.metrics()
    verdict = plan_verdict(server, demo.eval_json, tmp_path / "plan")
    # a rotated map drafts other tokens: a collapse, a gap below the eval on any demo. Layers one late on the demo's
    # 4-layer target still carry most of the features, in other slots, and the toy drafter leans little on them: on
    # one demo build they cost (4.11 against the eval's 4.31), on another they gained (4.44 against 4.34), on a third
    # they changed no round at all (4.69 both, CI runs here). What holds on every build is that the cause is named.
    if breaks is rotate_d2t:
        assert verdict["state"] == "gap" and verdict["delta"] < 0, verdict
    assert [c["name"] for c in verdict["causes"]] == [cause], verdict["line"]
    assert f"causes: {cause}:" in verdict["line"]
    if record := os.environ.get("NODEDECK_ENGINE_RECORD"):                # the fast tier's pages (alerts)
        Path(record).mkdir(parents=True, exist_ok=True)
        (Path(record) / f"vllm032_cpu_eagle3_{breaks.__name__}.metrics").write_text(page)

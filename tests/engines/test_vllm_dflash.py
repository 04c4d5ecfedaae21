"""Real vLLM serves the demo's target with a DFlash drafter nodedeck trained and exported: its outputs are the HF
target's greedy outputs and its spec-decode counters are `nodedeck-train eval`'s, prompt by prompt."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from tests.engines.conftest import BIN
from tests.engines.test_vllm_eagle3 import one, raw
from tests.engines.vllm_server import VllmServer
from trainer.evaluate import _eos_ids, greedy_decode, prompts_from_tokenized

pytestmark = [pytest.mark.engines, pytest.mark.timeout(1200)]   # real vLLM servers start in minutes on 2 CPUs

BLOCK = 8              # DFlash block of the drafter trained here: vLLM drafts BLOCK - 1 tokens after the bonus one
K = BLOCK - 1
PROMPTS, NEW = 6, 24   # the demo's eval prompts and length
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"


@pytest.fixture(scope="module")
def dflash(demo, tmp_path_factory):
    """A DFlash drafter trained briefly (online) on the target's own greedy continuations of the eval prompts, so
    it is accepted often and partially (the paths where an engine could part from the eval), and its eval."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = tmp_path_factory.mktemp("dflash")
    target = AutoModelForCausalLM.from_pretrained(demo.target, dtype=torch.float32).eval()
    eos = _eos_ids(target, AutoTokenizer.from_pretrained(demo.target))
    with open(work / "greedy.jsonl", "w") as f:
        for pid, prompt in prompts_from_tokenized(demo.tokenized, 3 * PROMPTS):
            new = greedy_decode(target, prompt, 2 * NEW, eos)
            f.write(json.dumps({"id": pid, "input_ids": prompt + new,
                                "loss_mask": [0] * len(prompt) + [1] * len(new)}) + "\n")
    drafter = work / "drafter" / "final"
    for step in (["train", "--mode", "dflash", "--target", str(demo.target), "--online", "--data",
                  str(work / "greedy.jsonl"), "--out", str(work / "drafter"), "--block-size", str(BLOCK),
                  "--draft-layers", "1", "--lr", "5e-3", "--epochs", "12", "--log-every", "50"],
                 ["eval", "--target", str(demo.target), "--drafter", str(drafter), "--data", str(demo.tokenized),
                  "--out", str(work / "eval.json"), "--num-prompts", str(PROMPTS), "--max-new-tokens", str(NEW),
                  "--num-draft-tokens", str(K), "--no-baseline"]):
        r = subprocess.run([str(BIN / "nodedeck-train"), *step, "--device", "cpu", "--dtype", "float32"],
                           capture_output=True, text=True, timeout=900, check=False)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return drafter, json.loads((work / "eval.json").read_text())


def test_dflash_greedy_outputs_and_acceptance_equal_the_eval(demo, dflash, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    drafter, ev = dflash
    assert (ev["mode"], ev["num_prompts"], ev["num_draft_tokens"]) == ("dflash", PROMPTS, K)
    prompts = prompts_from_tokenized(demo.tokenized, PROMPTS)
    target = AutoModelForCausalLM.from_pretrained(demo.target, dtype=torch.float32).eval()
    eos = _eos_ids(target, AutoTokenizer.from_pretrained(demo.target))
    spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": K}
    drafts = accepted = 0
    with VllmServer(demo.target, tmp_path / "server.log", speculative=spec) as server:
        for (pid, prompt), rec in zip(prompts, ev["per_prompt"], strict=True):
            assert rec["id"] == pid
            before = raw(server.metrics())
            got = server.complete(prompt, NEW)["choices"][0]["token_ids"]
            after = raw(server.metrics())
            assert got == greedy_decode(target, prompt, NEW, eos), pid
            d = one(after, DRAFTS) - one(before, DRAFTS)
            a = one(after, ACCEPTED) - one(before, ACCEPTED)
            assert (d, a) == (rec["rounds"], round(rec["accept_len"] * rec["rounds"]) - rec["rounds"]), pid
            drafts, accepted = drafts + d, accepted + a
    assert 1 + accepted / drafts == pytest.approx(ev["mean_accept_len"], abs=1e-12)
    # drafts are accepted (1.21 on the demo's target, 216 steps): the equality above compares accepts, not only
    # rejections of an untrained drafter
    assert accepted > 0 and ev["mean_accept_len"] > 1.1

"""Real vLLM serves the demo's target with a 2-layer DFlash drafter nodedeck trained and exported, accepted about 2
tokens a round: its outputs are the HF target's greedy outputs; its spec-decode counters are, prompt by prompt, those
of `nodedeck-train eval`'s decoding with vLLM 0.32's CPU kernel difference put in (every layer's context keys normed
with layer 0's k_norm, docs/engines.md), so every other part of what vLLM drafts from which context is the eval's;
and the train-serve verdict on the real eval says how many prompts part, and the kernel is the cause it names.

Trained as before (18 greedy continuations, 12 epochs) with 2 layers instead of 1: accepted 3.36 a round here against
1.21, in the same training time (555 s either way at load 9-14 on 2 cores; the online target's forward dominates)."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest
import torch
from torch import nn

from ops.gap import served_checks
from ops.hosts.local import LocalHost
from ops.measured_by import Engine, device_in_log
from ops.served import server_command
from tests.engines.conftest import BIN
from tests.engines.test_vllm_eagle3 import one, raw
from tests.engines.test_vllm_train_serve import plan_verdict, probe
from tests.engines.vllm_server import VllmServer
from trainer.evaluate import _eos_ids, evaluate_drafter, greedy_decode, prompts_from_tokenized

pytestmark = [pytest.mark.engines, pytest.mark.timeout(1500)]   # real vLLM servers start in minutes on 2 CPUs

BLOCK = 8              # DFlash block of the drafter trained here: vLLM drafts BLOCK - 1 tokens after the bonus one
K = BLOCK - 1
LAYERS = 2             # 2+ layers: what vLLM 0.32's CPU kernel computes otherwise (one layer: nothing)
PROMPTS, NEW = 6, 24   # the demo's eval prompts and length
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"


class ContextKeysNormedByLayer0(nn.Module):
    """vLLM 0.32's CPU `rms_norm` takes one weight row: the context keys of every DFlash layer get layer 0's k_norm
    (`DFlashQwen3Model._normalize_context_k`); the block's own keys keep their layer's. Drafting one block of
    K + 1 slots, the keys are the context's and then the block's."""

    def __init__(self, own: nn.Module, first: nn.Module):
        super().__init__()
        self.own, self.first = own, [first]        # a list: layer 0's norm is not a submodule of this one

    def forward(self, k: torch.Tensor) -> torch.Tensor:   # [B, kv heads, context + K + 1, head_dim]
        return torch.cat([self.first[0](k[:, :, :-(K + 1)]), self.own(k[:, :, -(K + 1):])], dim=2)


def as_vllm_cpu_drafts(drafter):
    for layer in drafter.layers[1:]:
        layer.self_attn.k_norm = ContextKeysNormedByLayer0(layer.self_attn.k_norm, drafter.layers[0].self_attn.k_norm)
    return drafter


@pytest.fixture(scope="module")
def dflash(demo, tmp_path_factory):
    """A DFlash drafter trained (online) on the target's own greedy continuations of the eval prompts and twelve
    more, so it is accepted often and partially (the paths where an engine could part from the eval), and its eval."""
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
                  "--draft-layers", str(LAYERS), "--lr", "5e-3", "--epochs", "12", "--log-every", "50"],
                 ["eval", "--target", str(demo.target), "--drafter", str(drafter), "--data", str(demo.tokenized),
                  "--out", str(work / "eval.json"), "--num-prompts", str(PROMPTS), "--max-new-tokens", str(NEW),
                  "--num-draft-tokens", str(K), "--no-baseline"]):
        r = subprocess.run([str(BIN / "nodedeck-train"), *step, "--device", "cpu", "--dtype", "float32"],
                           capture_output=True, text=True, timeout=900, check=False)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return drafter, work / "eval.json"


def test_dflash_served_by_vllm_is_the_eval_but_for_the_cpu_kernel_and_the_verdict_names_it(demo, dflash, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.export import load_export

    drafter, eval_json = dflash
    ev = json.loads(eval_json.read_text())
    assert (ev["mode"], ev["num_prompts"], ev["num_draft_tokens"]) == ("dflash", PROMPTS, K)
    # accepted about 2 a round: full and partial accepts alike, where a parting shows
    assert ev["mean_accept_len"] > 1.9, ev["mean_accept_len"]
    prompts = prompts_from_tokenized(demo.tokenized, PROMPTS)
    target = AutoModelForCausalLM.from_pretrained(demo.target, dtype=torch.float32).eval()
    eos = _eos_ids(target, AutoTokenizer.from_pretrained(demo.target))
    as_cpu = evaluate_drafter(target, as_vllm_cpu_drafts(load_export(drafter, demo.target)), prompts, max_new=NEW,
                              k=K, eos=eos, baseline=False)
    spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": K}
    with VllmServer(demo.target, tmp_path / "server.log", speculative=spec) as server:
        for (pid, prompt), rec in zip(prompts, as_cpu["per_prompt"], strict=True):
            assert rec["id"] == pid
            before = raw(server.metrics())
            got = server.complete(prompt, NEW)["choices"][0]["token_ids"]
            after = raw(server.metrics())
            assert got == greedy_decode(target, prompt, NEW, eos), pid
            d = one(after, DRAFTS) - one(before, DRAFTS)
            a = one(after, ACCEPTED) - one(before, ACCEPTED)
            assert (d, a) == (rec["rounds"], round(rec["accept_len"] * rec["rounds"]) - rec["rounds"]), pid
        probe(server, demo.tokenized, ev, tmp_path / "plan" / "served.json")
    verdict = plan_verdict(server, eval_json, tmp_path / "plan")
    parted = verdict["prompts_parted"]
    # the real eval drafts as trained: vLLM's CPU build parts from it on some prompts, and the checks run
    assert parted["prompts"] == PROMPTS and parted["parted"] > 0, verdict["line"]
    checks = {c["name"]: c for c in verdict["checks"]}
    assert all(c["ok"] for n, c in checks.items() if n != "engine kernel"), verdict["line"]
    # the plan's server stage did not run under nodedeck here: the device its log names (CPU) is read from this
    # server's log, as `plan outcome` reads a server stage's (test_train_serve.py), and the kernel is the cause
    served = json.loads((tmp_path / "plan" / "served.json").read_text())
    device = device_in_log(server.log.read_text(errors="replace"))
    assert device == "CPU"
    found = served_checks(LocalHost(), server_command(shlex.join(server.argv)), ev, None, True,
                          Engine.from_json(served["engine"]), device)
    assert [c.name for c in found if c.ok is False] == ["engine kernel"], found

"""`nodedeck-train train` under torchrun with --nnodes 2: rank and world from the environment, one
rank per "node" (two torchrun agents on this machine, c10d rendezvous, gloo), each with its own OUT
as on nodes without a shared disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.support.sshd import free_port

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_two_nodes_one_rank_each(tmp_path):
    from tests.test_trainer_hidden_states import write_tokenized
    from trainer.hidden_states import extract_to_dir
    from trainer.vocab import write_draft_vocab

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=700, max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "target")
    write_tokenized(tmp_path / "data.jsonl", 8, seed=4)
    write_draft_vocab(tmp_path / "data.jsonl", tmp_path / "vocab.safetensors", target_vocab_size=700,
                      draft_vocab_size=64)
    extract_to_dir(tmp_path / "target", tmp_path / "data.jsonl", tmp_path / "hs", dtype="float32", device="cpu",
                   log=lambda m: None)
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    procs = []
    for node in (0, 1):
        cmd = [torchrun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "nd-test", "-m", "trainer.cli", "train",
               "--mode", "eagle3", "--target", str(tmp_path / "target"), "--vocab", str(tmp_path / "vocab.safetensors"),
               "--hidden-states", str(tmp_path / "hs"), "--out", str(tmp_path / f"out-node{node}"), "--batch-size", "2",
               "--max-steps", "2", "--ttt-length", "2", "--num-workers", "0", "--device", "cpu",
               "--dist-timeout", "120"]
        procs.append(subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-2000:] for o in outs)
    done = json.loads((tmp_path / "out-node0" / "done.json").read_text())
    assert done["world_size"] == 2 and done["steps"] == 2  # 8 samples, 2 ranks x 2 per batch: 2 steps per epoch
    assert (tmp_path / "out-node0" / "final" / "config.json").exists()
    assert not (tmp_path / "out-node1" / "done.json").exists()  # only global rank 0 writes the results

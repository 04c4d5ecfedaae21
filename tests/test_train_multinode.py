"""Training on several nodes without a shared disk: each rank has its own OUT, as on nodes that do not
share one. `nodedeck-train train` under torchrun --nnodes 2 (two torchrun agents on this machine), and
a resume whose checkpoint only rank 0's OUT holds."""

from __future__ import annotations

import faulthandler
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from transformers import LlamaConfig, LlamaForCausalLM

from tests.support.spawned import join_within
from tests.support.sshd import free_port

REPO = Path(__file__).resolve().parents[1]
STEPS = 4


def make_tiny(root: Path) -> Path:
    """A tiny random target, 8 tokenized samples, their draft vocab and hidden states, under root."""
    from tests.test_trainer_hidden_states import write_tokenized
    from trainer.hidden_states.extract import extract_to_dir
    from trainer.vocab import write_draft_vocab

    root.mkdir(parents=True, exist_ok=True)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=700, max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(root / "target")
    write_tokenized(root / "data.jsonl", 8, seed=4)
    write_draft_vocab(root / "data.jsonl", root / "vocab.safetensors", target_vocab_size=700, draft_vocab_size=64)
    extract_to_dir(root / "target", root / "data.jsonl", root / "hs", dtype="float32", device="cpu",
                   log=lambda m: None)
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("multinode"))


@pytest.mark.slow
def test_two_nodes_one_rank_each(tiny, tmp_path):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    procs = []
    for node in (0, 1):
        cmd = [torchrun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "nd-test", "-m", "trainer.cli", "train",
               "--mode", "eagle3", "--target", str(tiny / "target"), "--vocab", str(tiny / "vocab.safetensors"),
               "--hidden-states", str(tiny / "hs"), "--out", str(tmp_path / f"out-node{node}"), "--batch-size", "2",
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
    assert not (tmp_path / "out-node1").exists()  # only global rank 0 writes to its OUT
    assert len(done["replica_sha256"]) == 2 and len(set(done["replica_sha256"])) == 1


class Crash(Exception):
    pass


def _resume_worker(rank: int, world: int, ports: list[int], base: list[str], root: str) -> None:
    faulthandler.enable(all_threads=True)   # a rank that aborts in C++ shows where its Python stood
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from trainer.distributed import unwrap
    from trainer.train import run

    final: dict[str, dict] = {}

    def keep(name):
        def on_step(trainer, _batch, _loss):
            if trainer.step == STEPS:
                final[name] = {k: v.detach().clone() for k, v in unwrap(trainer.model).named_parameters()}
        return on_step

    def crash_after_2(trainer, _batch, _loss):
        if trainer.step == 2:   # both ranks, after the step-2 checkpoint (--save-every 2)
            raise Crash

    def own_out(name):   # this rank's node's own disk
        return ["--out", os.path.join(root, f"{name}-node{rank}")]

    os.environ["MASTER_PORT"] = str(ports[0])   # a fresh rendezvous per run
    run([*base, *own_out("whole")], on_step=keep("whole"), log=lambda m: None)
    os.environ["MASTER_PORT"] = str(ports[1])
    try:
        run([*base, *own_out("split")], on_step=crash_after_2, log=lambda m: None)
    except Crash:
        pass
    os.environ["MASTER_PORT"] = str(ports[2])
    logs: list[str] = []
    run([*base, *own_out("split"), "--resume"], on_step=keep("split"), log=logs.append)
    torch.save({**final, "logs": logs}, os.path.join(root, f"rank{rank}.pt"))


def test_resume_on_nodes_without_a_shared_disk(tiny, tmp_path):
    """DFlash with feature noise and random anchors (per-rank RNG), two ranks, two OUT dirs: the run
    resumed from rank 0's checkpoint ends with the very weights of the uninterrupted run, on both ranks."""
    base = ["--mode", "dflash", "--block-size", "4", "--noise-start", "0.1", "--noise-warmup-steps", "2",
            "--draft-layers", "1", "--mask-token-id", "1", "--target", str(tiny / "target"),
            "--hidden-states", str(tiny / "hs"), "--batch-size", "1", "--max-steps", str(STEPS), "--save-every", "2",
            "--lr", "1e-2", "--num-workers", "0"]
    ctx = mp.spawn(_resume_worker, args=(2, [free_port() for _ in range(3)], base, str(tmp_path)), nprocs=2,
                   join=False)
    join_within(ctx, 240)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    for got in (r0, r1):
        assert any("resumed from" in m and "at step 2" in m for m in got["logs"]), got["logs"]
        assert got["whole"].keys() == got["split"].keys()
        assert all(torch.equal(got["whole"][k], got["split"][k]) for k in got["whole"])
        assert all(torch.equal(got["split"][k], r0["split"][k]) for k in got["split"])
    # the whole checkpoint, every rank's RNG state included, is on rank 0's disk; rank 1's holds nothing
    step2 = tmp_path / "split-node0" / "checkpoints" / "step-00000002"
    assert sorted(p.name for p in step2.iterdir()) == ["meta.json", "rng-rank0.pt", "rng-rank1.pt", "state.pt"]
    assert not (tmp_path / "split-node1").exists()
    done = json.loads((tmp_path / "split-node0" / "done.json").read_text())
    assert done["steps"] == STEPS and done["replica_sha256"][0] == done["replica_sha256"][1]


def test_weights_digest_sees_one_changed_value():
    from trainer.distributed import weights_sha256

    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    b = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    b.load_state_dict(a.state_dict())
    assert weights_sha256(a) == weights_sha256(b)
    with torch.no_grad():
        b[1].bias[0] = torch.nextafter(b[1].bias[0], torch.tensor(1.0))   # one value, one ulp
    assert weights_sha256(a) != weights_sha256(b)

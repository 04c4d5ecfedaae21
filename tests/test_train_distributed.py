"""Two gloo processes on CPU: DDP keeps parameters identical, the sampler shards batches, FSDP agrees."""

from __future__ import annotations

import json
import os
import random

import torch
import torch.multiprocessing as mp
from transformers import LlamaConfig, LlamaForCausalLM

from tests.support.spawned import join_within
from tests.support.sshd import free_port

STEPS = 3


def _worker(rank: int, world: int, ports: list[int], base: list[str], root: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from trainer.distributed import full_model_state, unwrap
    from trainer.train import run

    for port, (name, extra) in zip(ports, (("ddp", []), ("fsdp", ["--fsdp"]))):
        os.environ["MASTER_PORT"] = str(port)  # a fresh rendezvous per run
        seen, result = [], {}

        def on_step(trainer, batch, _loss):
            seen.append(list(batch))
            if name == "ddp" and trainer.step in (1, STEPS):
                result[f"local{trainer.step}"] = {k: v.detach().clone() for k,
                                                  v in unwrap(trainer.model).named_parameters()}
            if trainer.step == STEPS:
                result["full"] = full_model_state(trainer.model)  # a collective under FSDP

        run([*base, "--out", os.path.join(root, name), *extra], on_step=on_step, log=lambda m: None)
        torch.save({"seen": seen, **result}, os.path.join(root, f"{name}-rank{rank}.pt"))


def test_two_gloo_ranks_ddp_and_fsdp(tmp_path):
    from trainer.batching import BucketBatchSampler
    from trainer.hidden_states.extract import extract_to_dir
    from trainer.vocab import write_draft_vocab

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=96, max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "target")
    rng = random.Random(0)
    rows = [[rng.randrange(96) for _ in range(rng.randint(8, 24))] for _ in range(16)]
    with (tmp_path / "data.jsonl").open("w") as f:
        for i, ids in enumerate(rows):
            f.write(json.dumps({"id": f"s{i}", "input_ids": ids, "loss_mask": [0, 0] + [1] * (len(ids) - 2)}) + "\n")
    write_draft_vocab(tmp_path / "data.jsonl", tmp_path / "vocab.safetensors", target_vocab_size=96,
                      draft_vocab_size=48)
    extract_to_dir(tmp_path / "target", tmp_path / "data.jsonl", tmp_path / "hs", dtype="float32", device="cpu",
                   log=lambda m: None)
    base = ["--mode", "eagle3", "--target", str(tmp_path / "target"), "--vocab", str(tmp_path / "vocab.safetensors"),
            "--hidden-states", str(tmp_path / "hs"), "--batch-size", "2", "--max-steps", str(STEPS), "--lr", "1e-2",
            "--ttt-length", "3", "--num-workers", "0"]
    ctx = mp.spawn(_worker, args=(2, [free_port(), free_port()], base, str(tmp_path)), nprocs=2, join=False)
    join_within(ctx, 240)

    r0, r1 = (torch.load(tmp_path / f"ddp-rank{r}.pt", weights_only=False) for r in (0, 1))
    # the sampler shards: each rank runs its own positions of the same epoch order
    lengths = [len(x) for x in rows]
    for r, got in ((0, r0), (1, r1)):
        want = BucketBatchSampler(lengths, batch_size=2, seed=0, rank=r, world_size=2).epoch_batches(0)[:STEPS]
        assert got["seen"] == want
    assert not {i for b in r0["seen"] for i in b} & {i for b in r1["seen"] for i in b}
    # different data on each rank, yet identical parameters after every step: gradients were averaged
    for step in (1, STEPS):
        a, b = r0[f"local{step}"], r1[f"local{step}"]
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(r0["local1"]["fc.weight"], r0[f"local{STEPS}"]["fc.weight"])  # and they did train
    trained = r0["full"]
    done = json.loads((tmp_path / "ddp" / "done.json").read_text())
    assert done["world_size"] == 2 and done["steps"] == STEPS
    # FSDP (sharded parameters and optimiser state) lands where DDP does
    f0 = torch.load(tmp_path / "fsdp-rank0.pt", weights_only=False)
    assert f0["seen"] == r0["seen"]
    for k, v in trained.items():
        assert torch.allclose(v.float(), f0["full"][k].float(), atol=1e-5), k
    assert json.loads((tmp_path / "fsdp" / "done.json").read_text())["steps"] == STEPS

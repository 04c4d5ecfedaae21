"""Drafter training throughput: steps/s, tokens/s and (on CUDA) MFU of the real training step.

One run, same small target and data, side by side:
- EAGLE-3 with the default TTT unroll of 7 steps, and with 1 step (the unroll's cost ratio),
- DFlash with block 16;
and nodedeck's EAGLE-3 module vs SpecForge's own `LlamaForCausalLMEagle3` (same weights, config,
batch, TTT 7 loss, AdamW, threads): steps/s of the model step (forward, loss, backward, optimiser)
and their ratio (goal >= 1.0). SpecForge's RMSNorm is `torch.compile`d; off CUDA it runs eagerly
here (no C++ toolchain needed). Skipped, with the reason, where `specforge` is not installed.
Each runs `Trainer.train_step` (features, loss, metrics, backward, clip, AdamW, schedule) on offline
hidden states of a random-weight Llama target built here. FLOPs per step are counted with
torch's FlopCounterMode on one step, less the teacher's (EAGLE-3's target lm_head over the offline
states); MFU = drafter FLOPs/step x steps/s / the device's dense bf16 peak (known GPUs, H100 SXM,
PCIe and NVL told apart by name; CPU runs print achieved GFLOP/s instead).

    .venv/bin/python bench/bench_training.py [--hidden 256] [--layers 4] [--vocab 4096] [--seq 512]
        [--batch 4] [--steps 10] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from trainer.batching import collate  # noqa: E402
from trainer.distributed import DistInfo  # noqa: E402
from trainer.train import Trainer, build_parser  # noqa: E402
from trainer.train_config import TrainConfig  # noqa: E402

# Dense bf16 tensor-core peaks (FLOP/s) by device-name substring, the most specific first: NVML/CUDA names an
# H100 SXM "NVIDIA H100 80GB HBM3", the PCIe card "NVIDIA H100 PCIe", the NVL cards "... NVL".
PEAK_BF16 = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H200 NVL", 835e12), ("H100", 989e12),
             ("H200", 989e12), ("H20", 148e12), ("B200", 2250e12), ("A100", 312e12), ("L40S", 362e12),
             ("A10G", 70e12), ("L4", 121e12), ("4090", 165e12), ("A6000", 155e12))


def peak_bf16(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU by its name (None when unknown)."""
    return next((v for k, v in PEAK_BF16 if k in device_name), None)


def build_inputs(root: Path, hidden: int, layers: int, vocab: int, seq: int, samples: int) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.hidden_states.extract import extract_to_dir
    from trainer.vocab import write_draft_vocab

    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=max(hidden // 64, 1), num_key_value_heads=max(hidden // 128, 1),
                      vocab_size=vocab, max_position_embeddings=max(seq, 2048), tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(root / "target")
    rng = random.Random(0)
    with (root / "data.jsonl").open("w") as f:
        for i in range(samples):
            f.write(json.dumps({"id": str(i), "input_ids": [rng.randrange(vocab) for _ in range(seq)],
                                "loss_mask": [0] * 16 + [1] * (seq - 16)}) + "\n")
    write_draft_vocab(root / "data.jsonl", root / "vocab.safetensors", target_vocab_size=vocab,
                      draft_vocab_size=vocab // 4)
    extract_to_dir(root / "target", root / "data.jsonl", root / "hs", dtype="bfloat16", log=lambda m: None)
    return {"target": root / "target", "vocab": root / "vocab.safetensors", "hs": root / "hs"}


def measure(name: str, argv: list[str], device: torch.device, steps: int) -> dict:
    cfg = TrainConfig.from_args(build_parser().parse_args(argv))
    trainer = Trainer(cfg, DistInfo(device=device), log=lambda m: None)
    batches = trainer.sampler.epoch_batches(0)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    trainer.train_step(batches[0])  # warm-up
    with FlopCounterMode(display=False) as counter:
        trainer.train_step(batches[1 % len(batches)])
    # The teacher's signal (EAGLE-3: the target lm_head over the offline last states) is not the drafter's
    # training work: counted on the same batch alone and left out of the FLOPs MFU is computed from.
    batch = {k: v.to(device) for k, v in collate([trainer.source[i] for i in batches[1 % len(batches)]]).items()}
    with FlopCounterMode(display=False) as teacher, trainer.autocast:
        trainer._features(batch)
    flops = counter.get_total_flops() - teacher.get_total_flops()
    tokens = 0
    sync()
    t0 = time.perf_counter()
    for i in range(steps):
        ids = batches[(2 + i) % len(batches)]
        trainer.train_step(ids)
        tokens += sum(trainer.source.lengths[j] for j in ids)
    sync()
    dt = time.perf_counter() - t0
    return {"name": name, "steps_per_s": steps / dt, "tokens_per_s": tokens / dt, "flops_per_step": flops,
            "flops_per_s": flops * steps / dt}


def versus_specforge(inp: dict, a, device: torch.device) -> dict | None:
    """Model-step steps/s of nodedeck's EAGLE-3 drafter and SpecForge's, on identical weights and data, and on CUDA
    each one's peak memory above what was resident before its first step (activations, gradients, optimizer)."""
    try:
        from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    except ImportError as exc:
        print(f"SpecForge comparison skipped: {exc} (pip install --no-deps specforge==0.2.0)")
        return None
    from contextlib import nullcontext

    from safetensors.torch import load_file
    from transformers import LlamaConfig

    from trainer.export import export_drafter
    from trainer.losses import eagle3_loss, eagle3_targets

    args = build_parser().parse_args(["--mode", "eagle3", "--vocab", str(inp["vocab"]), "--target", str(inp["target"]),
                                      "--hidden-states", str(inp["hs"]), "--batch-size", str(a.batch),
                                      "--out", str(inp["target"].parent / "vs"), "--device", a.device,
                                      "--dtype", "float32"])
    trainer = Trainer(TrainConfig.from_args(args), DistInfo(device=device), log=lambda m: None)
    ours = trainer.model
    export = export_drafter(ours, inp["target"].parent / "vs-export", dtype="float32")
    theirs = LlamaForCausalLMEagle3(LlamaConfig.from_pretrained(export), attention_backend="sdpa")
    theirs.load_state_dict(load_file(str(export / "model.safetensors")))
    theirs = theirs.to(device).train()
    theirs.embed_tokens.weight.requires_grad_(False)
    batches = []
    for ids in trainer.sampler.epoch_batches(0)[:4]:
        batch = {k: v.to(device) for k, v in collate([trainer.source[i] for i in ids]).items()}
        logits = torch.matmul(batch["last"].float(), trainer.objective.head.float().T)
        probs, pmask = eagle3_targets(logits, batch["loss_mask"], ours.draft_ids(), ours.t2d)
        batches.append((batch["aux"].float(), batch["input_ids"], probs, pmask))
    ttt = 7

    def specforge_logits(aux, ids):
        """SpecForge's TTT loop (OnlineEagle3Model): shifted tokens, per-step key/value cache."""
        b, t = ids.shape
        hidden = theirs.project_hidden_states(aux)
        mask = theirs.prepare_decoder_attention_mask(torch.ones(b, t, dtype=torch.bool, device=device), hidden, b, t, 0)
        positions, cache, out = torch.arange(t, device=device)[None], [[], []], []
        pad = torch.zeros(b, 1, dtype=ids.dtype, device=device)
        shifted = torch.cat([ids[:, 1:], pad], dim=1)
        for _ in range(ttt):
            hidden = theirs.backbone(theirs.embed_input_ids(shifted), hidden, cache, mask, positions, use_cache=False)
            out.append(theirs.compute_logits(hidden))
            shifted = torch.cat([shifted[:, 1:], pad], dim=1)
        return out

    def timed(model, logits_fn) -> tuple[float, float | None]:
        """(steps/s, peak MiB above the resident memory, None off CUDA)."""
        cuda = device.type == "cuda"
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        if cuda:
            sync()
            resident = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, betas=(0.9, 0.95))

        def step(i):
            aux, ids, probs, pmask = batches[i % len(batches)]
            loss, _ = eagle3_loss(logits_fn(aux, ids), probs, pmask, 0.8)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        step(0)  # warm-up
        sync()
        t0 = time.perf_counter()
        for i in range(a.steps):
            step(i + 1)
        sync()
        rate = a.steps / (time.perf_counter() - t0)
        return rate, (torch.cuda.max_memory_allocated(device) - resident) / 2**20 if cuda else None

    with torch.compiler.set_stance("force_eager") if device.type != "cuda" else nullcontext():
        nd, nd_mib = timed(ours, lambda aux, ids: ours(aux, ids, ttt))
        sf, sf_mib = timed(theirs, specforge_logits)
    return {"nodedeck": nd, "specforge": sf, "nodedeck_mib": nd_mib, "specforge_mib": sf_mib}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    device = torch.device(a.device)
    peak = None
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
        peak = peak_bf16(gpu)
        print(f"device: {gpu} (dense bf16 peak {'unknown' if peak is None else f'{peak / 1e12:.0f} TFLOP/s'})")
    else:
        print(f"device: cpu ({torch.get_num_threads()} threads)")
    with tempfile.TemporaryDirectory(prefix="bench-training-") as tmp:
        inp = build_inputs(Path(tmp), a.hidden, a.layers, a.vocab, a.seq, samples=max(4 * a.batch, 16))
        common = ["--target", str(inp["target"]), "--hidden-states", str(inp["hs"]), "--batch-size", str(a.batch),
                  "--out", str(Path(tmp) / "out"), "--device", a.device]
        versus = versus_specforge(inp, a, device)
        runs = [
            measure("eagle3 ttt=7", ["--mode", "eagle3", "--vocab", str(inp["vocab"]), *common], device, a.steps),
            measure("eagle3 ttt=1", ["--mode", "eagle3", "--vocab", str(inp["vocab"]), "--ttt-length", "1", *common],
                    device, a.steps),
            measure("dflash b=16", ["--mode", "dflash", "--mask-token-id", "0", *common], device, a.steps),
        ]
    print(f"{'run':<14} {'steps/s':>9} {'tokens/s':>11} {'GFLOP/step':>11} {'GFLOP/s':>9} {'MFU':>7}")
    for r in runs:
        mfu = f"{r['flops_per_s'] / peak:.1%}" if peak else "n/a"
        print(f"{r['name']:<14} {r['steps_per_s']:9.2f} {r['tokens_per_s']:11.0f} {r['flops_per_step'] / 1e9:11.2f} "
              f"{r['flops_per_s'] / 1e9:9.1f} {mfu:>7}")
    e7, e1, df = runs
    print(f"TTT unroll cost: ttt=7 step time / ttt=1 step time = {e1['steps_per_s'] / e7['steps_per_s']:.2f}x "
          f"(FLOPs ratio {e7['flops_per_step'] / e1['flops_per_step']:.2f}x)")
    print(f"DFlash b=16 vs EAGLE-3 ttt=7 tokens/s: {df['tokens_per_s'] / e7['tokens_per_s']:.2f}x")
    if versus:
        print(f"EAGLE-3 ttt=7 model step, float32: nodedeck {versus['nodedeck']:.2f} steps/s, SpecForge "
              f"{versus['specforge']:.2f} steps/s, ratio {versus['nodedeck'] / versus['specforge']:.2f}x (goal >= 1.0)")
        if versus["nodedeck_mib"] is not None:
            print(f"EAGLE-3 ttt=7 model step, peak memory above resident: nodedeck {versus['nodedeck_mib']:.0f} MiB, "
                  f"SpecForge {versus['specforge_mib']:.0f} MiB, ratio "
                  f"{versus['nodedeck_mib'] / versus['specforge_mib']:.2f}x (goal <= 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

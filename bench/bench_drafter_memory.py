"""Drafter memory at real sequence lengths: peak memory and steps/s of one training step, nodedeck vs SpecForge.

One EAGLE-3 step (TTT 7) and one DFlash step (512 anchors, block 16), batch 1, at T = 1024, 2048 and 4096,
on CPU in float32, side by side with SpecForge 0.2.0's own model classes at the same config and weights
(`LlamaForCausalLMEagle3` with its TTT loop, sdpa; `OnlineDFlashModel` over `DFlashDraftModel`, sdpa).
A step is forward, loss, backward and AdamW. Peak = the largest total of live tensor bytes during one
step, from torch's CPU memory profiler (allocations minus frees in time order), less what was live
before it; steps/s over a few steps without the profiler.

Sizes: hidden 1024 (8 heads of 128, 2 KV heads), intermediate 2816, target vocabulary 32000, draft
vocabulary 8000, one DFlash layer: a small but realistic drafter (Llama-3-8B's is 4096 / 14336 /
128256, DFlash uses 5 layers), so that every run fits a 24 GiB machine and finishes on 2 cores.
Goals (issue 33.3): peak at T=4096 no more than SpecForge's, linear in T (peak(4096) / peak(1024)
near 4, not 16), steps/s >= 1.0x SpecForge's. Skipped, with the reason, where specforge is not installed.

    .venv/bin/python bench/bench_drafter_memory.py [--lengths 1024,2048,4096] [--steps 2]
        [--drafters eagle3,dflash] [--ci]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from trainer.peak_memory import peak_cpu_bytes  # noqa: E402

H, INTER, HEADS, KV, HEAD_DIM, VOCAB, DRAFT_VOCAB, TARGET_LAYERS = 1024, 2816, 8, 2, 128, 32000, 8000, 32
CI = dict(H=256, INTER=704, HEADS=2, KV=1, VOCAB=4096, DRAFT_VOCAB=1024)


def steps_per_s(step, steps: int) -> float:
    step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return steps / (time.perf_counter() - t0)


def trainer_step(model, loss_fn):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, betas=(0.9, 0.95))

    def step():
        loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    step()  # AdamW's state exists from here on: the measured steps are steady-state ones
    return step


def eagle3_pair(tmp: Path, t: int, s: dict):
    """(nodedeck step, SpecForge step or None) of one EAGLE-3 TTT-7 training step at length t."""
    from trainer.export import export_drafter
    from trainer.losses import eagle3_loss, eagle3_targets
    from trainer.models import init_drafter
    from trainer.models.eagle3 import Eagle3Config

    cfg = Eagle3Config(hidden_size=s["H"], intermediate_size=s["INTER"], num_attention_heads=s["HEADS"],
                       num_key_value_heads=s["KV"], head_dim=HEAD_DIM, vocab_size=s["VOCAB"],
                       target_hidden_size=s["H"], target_num_layers=TARGET_LAYERS, draft_vocab_size=s["DRAFT_VOCAB"],
                       aux_layer_ids=[1, 15, 28], max_position_embeddings=8192)
    g = torch.Generator().manual_seed(0)
    d2t = torch.zeros(s["DRAFT_VOCAB"], dtype=torch.long)
    t2d = torch.zeros(s["VOCAB"], dtype=torch.bool)
    t2d[: s["DRAFT_VOCAB"]] = True
    embed, head = (torch.randn(s["VOCAB"], s["H"], generator=g) * 0.02 for _ in range(2))
    ours = init_drafter(cfg, embed, head, d2t=d2t, t2d=t2d, seed=0).train()
    aux = torch.randn(1, t, 3 * s["H"], generator=g)
    ids = torch.randint(0, s["VOCAB"], (1, t), generator=g)
    with torch.no_grad():  # the teacher's signal, outside the measured step
        probs, pmask = eagle3_targets(torch.randn(1, t, s["VOCAB"], generator=g), torch.ones(1, t, dtype=torch.long),
                                      ours.draft_ids(), ours.t2d)
    nd = trainer_step(ours, lambda: eagle3_loss(ours(aux, ids, 7), probs, pmask, 0.8)[0])
    try:
        from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    except ImportError:
        return nd, None
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    export = export_drafter(ours, tmp / f"eagle3-{t}", dtype="float32")
    theirs = LlamaForCausalLMEagle3(LlamaConfig.from_pretrained(export), attention_backend="sdpa")
    theirs.load_state_dict(load_file(str(export / "model.safetensors")))
    theirs.train().embed_tokens.weight.requires_grad_(False)

    def specforge_logits():
        """SpecForge's TTT loop (OnlineEagle3Model): shifted tokens, per-step key/value cache."""
        hidden = theirs.project_hidden_states(aux)
        mask = theirs.prepare_decoder_attention_mask(torch.ones(1, t, dtype=torch.bool), hidden, 1, t, 0)
        positions, cache, out = torch.arange(t)[None], [[], []], []
        pad = torch.zeros(1, 1, dtype=ids.dtype)
        shifted = torch.cat([ids[:, 1:], pad], dim=1)
        for _ in range(7):
            hidden = theirs.backbone(theirs.embed_input_ids(shifted), hidden, cache, mask, positions, use_cache=False)
            out.append(theirs.compute_logits(hidden))
            shifted = torch.cat([shifted[:, 1:], pad], dim=1)
        return out

    return nd, trainer_step(theirs, lambda: eagle3_loss(specforge_logits(), probs, pmask, 0.8)[0])


def dflash_pair(tmp: Path, t: int, s: dict):
    """(nodedeck step, SpecForge step or None) of one DFlash training step (512 anchors, block 16) at length t."""
    from trainer.export import export_drafter
    from trainer.losses import dflash_slot_weights
    from trainer.models import init_drafter
    from trainer.models.dflash import DFlashConfig, build_blocks

    cfg = DFlashConfig(hidden_size=s["H"], intermediate_size=s["INTER"], num_attention_heads=s["HEADS"],
                       num_key_value_heads=s["KV"], head_dim=HEAD_DIM, vocab_size=s["VOCAB"],
                       target_hidden_size=s["H"], target_num_layers=TARGET_LAYERS, max_position_embeddings=8192,
                       target_layer_ids=[1, 8, 15, 22, 28], mask_token_id=3, num_hidden_layers=1, block_size=16)
    g = torch.Generator().manual_seed(0)
    embed, head = (torch.randn(s["VOCAB"], s["H"], generator=g) * 0.02 for _ in range(2))
    ours = init_drafter(cfg, embed, head, seed=0).train()
    feats = torch.randn(1, t, 5 * s["H"], generator=g)
    ids = torch.randint(4, s["VOCAB"], (1, t), generator=g)
    lm = torch.ones(1, t, dtype=torch.long)
    slot_w = dflash_slot_weights(16, 7.0)
    ctx_pos = torch.arange(t)[None]

    anchors = min(512, t - 2)  # as DFlashObjective: no more blocks than anchor positions (SpecForge the same)

    def ours_loss():
        blocks = build_blocks(ids, lm, [t], block_size=16, num_anchors=anchors, mask_token_id=3,
                              generator=torch.Generator().manual_seed(1))
        valid = blocks["label_valid"]
        loss, _, _ = ours(feats, blocks["block_ids"], ctx_pos, blocks["block_positions"], blocks["layout"],
                          valid.flatten(1), labels=blocks["labels"][valid], weights=slot_w.expand_as(valid)[valid])
        return loss

    nd = trainer_step(ours, ours_loss)
    try:
        from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel
        from specforge.modeling.draft.dflash import DFlashDraftModel
    except ImportError:
        return nd, None
    from safetensors.torch import load_file
    from transformers import Qwen3Config

    export = export_drafter(ours, tmp / f"dflash-{t}", dtype="float32")
    draft = DFlashDraftModel(Qwen3Config.from_pretrained(export))
    draft.load_state_dict(load_file(str(export / "model.safetensors")), strict=False)
    lm_head, embed_tokens = nn.Linear(s["H"], s["VOCAB"], bias=False), nn.Embedding(s["VOCAB"], s["H"])
    with torch.no_grad():
        lm_head.weight.copy_(head)
        embed_tokens.weight.copy_(embed)
    lm_head.requires_grad_(False)
    embed_tokens.requires_grad_(False)
    theirs = OnlineDFlashModel(draft, lm_head, embed_tokens, mask_token_id=3, block_size=16, attention_backend="sdpa",
                               num_anchors=512, loss_decay_gamma=7.0).train()
    return nd, trainer_step(theirs, lambda: theirs(ids, feats, lm)[0])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="1024,2048,4096")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--drafters", default="eagle3,dflash", help="comma-separated: eagle3, dflash")
    p.add_argument("--ci", action="store_true", help="CI size: hidden 256, T = 128 and 256, one timed step")
    a = p.parse_args()
    sizes = dict(H=H, INTER=INTER, HEADS=HEADS, KV=KV, VOCAB=VOCAB, DRAFT_VOCAB=DRAFT_VOCAB)
    lengths = [int(x) for x in a.lengths.split(",")]
    if a.ci:
        sizes, lengths, a.steps = CI, [128, 256], 1
    torch.manual_seed(0)
    print(f"cpu, {torch.get_num_threads()} threads, float32, batch 1; hidden {sizes['H']}, vocab {sizes['VOCAB']}")
    print(f"{'run':<8} {'T':>5} {'nodedeck MiB':>13} {'SpecForge MiB':>14} {'ratio':>6} {'nd steps/s':>11} "
          f"{'SF steps/s':>11} {'speed':>6}")
    worst = 1.0
    peaks: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-drafter-memory-") as tmp, torch.compiler.set_stance("force_eager"):
        for name, pair in (("eagle3", eagle3_pair), ("dflash", dflash_pair)):
            if name not in a.drafters.split(","):
                continue
            for t in lengths:
                ours, theirs = pair(Path(tmp), t, sizes)
                nd_peak, nd_speed = peak_cpu_bytes(ours) / 2**20, steps_per_s(ours, a.steps)
                peaks.setdefault(name, []).append(nd_peak)
                if theirs is None:
                    print(f"{name:<8} {t:>5} {nd_peak:13.0f} {'(no specforge)':>14} {'':>6} {nd_speed:11.3f}")
                    continue
                sf_peak, sf_speed = peak_cpu_bytes(theirs) / 2**20, steps_per_s(theirs, a.steps)
                print(f"{name:<8} {t:>5} {nd_peak:13.0f} {sf_peak:14.0f} {nd_peak / sf_peak:6.2f} {nd_speed:11.3f} "
                      f"{sf_speed:11.3f} {nd_speed / sf_speed:5.2f}x")
                worst = max(worst, nd_peak / sf_peak)
                del ours, theirs
    for name, series in peaks.items():
        growth = series[-1] / series[0]
        print(f"{name}: peak grows {growth:.2f}x from T={lengths[0]} to T={lengths[-1]} "
              f"(linear: {lengths[-1] / lengths[0]:.0f}x, quadratic: {(lengths[-1] / lengths[0]) ** 2:.0f}x)")
    if a.ci and worst > 10:
        print(f"peak memory {worst:.1f}x SpecForge's: an order of magnitude off the goal (<= 1.0x)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

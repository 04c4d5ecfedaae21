"""Train an EAGLE-3 or DFlash drafter on target hidden states (offline shards or the target online).

    python -m trainer.train --mode eagle3|dflash --target DIR [--vocab draft_vocab.safetensors]
        (--hidden-states DIR | --online --data tokenized.jsonl) --out OUT [options]
    torchrun --nproc-per-node 8 -m trainer.train ...     (DDP; add --fsdp to shard large drafters)

Writes under OUT: run.json (arguments, world size, start), metrics.jsonl (one flat JSON object per
logged step: step, epoch, loss, lr, grad_norm, tokens_per_s, acc_i, top4_acc, top8_acc,
streak_top1/4/8, accept_len, EAGLE-3 ploss_i, DFlash noise), checkpoints/ (see trainer.checkpoint),
final/ (the SGLang export, see trainer.export) and, last of all, done.json (the completion record).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from ops.errors import NodedeckError, UserError
from trainer.batching import BucketBatchSampler, HiddenStateSource, TokenizedSource, collate
from trainer.checkpoint import load_checkpoint, save_checkpoint, set_rng_state
from trainer.cli import step_main
from trainer.distributed import DistInfo, all_reduce_sum, cleanup, init_distributed, load_full_state, unwrap, wrap_model
from trainer.jsonl import write_json
from trainer.losses import dflash_slot_weights, eagle3_loss, eagle3_targets, gamma_for_block, weighted_cross_entropy
from trainer.metrics import MetricsWriter, Stats, dflash_stats, eagle3_stats
from trainer.models import init_drafter
from trainer.models.dflash import DFlashConfig, NoiseSchedule, add_feature_noise, build_blocks
from trainer.models.eagle3 import Eagle3Config
from trainer.models.target import load_embed_and_head, load_target_config
from trainer.optim import build_optimizer, build_scheduler, clip_gradients, warmup_steps_for

MODE_DEFAULTS = {"eagle3": {"lr": 1e-4, "warmup_ratio": 0.015}, "dflash": {"lr": 6e-4, "warmup_ratio": 0.04}}
# Arguments that must not change when resuming (they define the model or the data order).
RESUME_FIXED = ("mode", "target", "vocab", "hidden_states", "data", "online", "seed", "batch_size", "batch_tokens",
                "num_buckets", "max_length", "max_samples", "ttt_length", "block_size", "draft_layers", "aux_layers")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nodedeck-train train", description=__doc__.splitlines()[0])
    a = p.add_argument
    a("--mode", required=True, choices=["eagle3", "dflash"])
    a("--target", "--model", dest="target", required=True, help="target model directory (config, tokenizer, safetensors)")
    a("--vocab", help="draft vocabulary safetensors (d2t/t2d; eagle3 only: DFlash predicts the full target vocabulary)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--hidden-states", help="offline hidden-state directory (nodedeck-train hidden-states)")
    src.add_argument("--online", action="store_true", help="run the target on each batch (needs --data)")
    a("--data", help="tokenized JSONL for --online")
    a("--aux-layers", help="--online: comma-separated target layers to read (default as in hidden-states)")
    a("--out", required=True, help="output directory")
    a("--epochs", type=int, default=1)
    a("--max-steps", type=int, help="stop after this many optimiser steps (also sizes the LR schedule)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--batch-size", type=int, help="sequences per batch per rank (default 1)")
    size.add_argument("--batch-tokens", type=int, help="token budget per batch per rank: longest x count")
    a("--max-length", type=int, default=2048, help="truncate sequences to this many tokens")
    a("--num-buckets", type=int, default=8, help="length buckets for batching")
    a("--num-workers", type=int, help="processes reading batches ahead (default 2 offline, 0 online)")
    a("--lr", type=float, help="peak learning rate (default 1e-4 eagle3, 6e-4 dflash)")
    a("--warmup-ratio", type=float, help="warmup share of all steps (default 0.015 eagle3, 0.04 dflash)")
    a("--min-lr-ratio", type=float, default=0.0, help="cosine floor as a fraction of the peak")
    a("--weight-decay", type=float, default=0.0)
    a("--betas", default="0.9,0.95")
    a("--max-grad-norm", type=float, default=1.0, help="gradient clipping (0: off)")
    a("--ttt-length", type=int, default=7, help="eagle3: training-time-test steps")
    a("--ttt-decay", type=float, default=0.8, help="eagle3: loss weight decay per TTT step")
    a("--block-size", type=int, default=16, help="dflash: block size")
    a("--gamma", type=float, help="dflash: slot weight exp(-(k-1)/gamma) (default by block size: 7 for 16)")
    a("--num-anchors", type=int, default=512,
      help="dflash: blocks per sequence, as SpecForge (fewer where a batch has fewer anchor positions)")
    a("--draft-layers", type=int, default=5, help="dflash: decoder layers of the drafter (SpecForge's configs: 5)")
    a("--mask-token-id", type=int, help="dflash: mask token (default: the tokenizer's mask, else a spare id, else pad)")
    a("--noise-start", type=float, default=0.0, help="dflash: context-feature noise after warmup (0: off)")
    a("--noise-end", type=float, help="dflash: noise at the last step (default: --noise-start)")
    a("--noise-warmup-steps", type=int, default=0, help="dflash: linear ramp 0 -> --noise-start")
    a("--log-every", type=int, default=1)
    a("--metrics", help="metrics JSONL (default OUT/metrics.jsonl)")
    a("--save-every", type=int, default=0, help="checkpoint every N steps (0: only at the end)")
    a("--keep-checkpoints", type=int, default=3)
    a("--resume", action="store_true", help="continue from OUT's latest checkpoint")
    a("--seed", type=int, default=0)
    a("--max-samples", type=int, help="use only the first N samples (smoke runs)")
    a("--device", help="torch device (default cuda when available)")
    a("--dtype", choices=["bfloat16", "float32"], help="compute dtype (default bfloat16 on CUDA, float32 on CPU)")
    a("--trust-remote-code", action="store_true", help="allow the model's own modelling/tokenizer code")
    a("--device-map", help="--online: spread a target larger than one GPU over the visible GPUs (e.g. auto)")
    a("--fsdp", action="store_true", help="shard the drafter with FSDP instead of DDP")
    a("--dist-timeout", type=float, default=1800.0, help="seconds a collective may wait for a peer before failing")
    a("--export-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    a("--wandb-project", help="also log to this wandb project (when wandb is installed)")
    a("--tensorboard-dir", help="also log to tensorboard here (when installed)")
    return p


def _check_args(args) -> None:
    if args.online and not args.data:
        raise UserError("--online needs --data tokenized.jsonl")
    if args.data and not args.online:
        raise UserError("--data is for --online; offline training reads --hidden-states")
    if args.mode == "eagle3" and not args.vocab:
        raise UserError("--mode eagle3 needs --vocab draft_vocab.safetensors (nodedeck-train vocab)")
    for name in ("epochs", "log_every", "ttt_length", "block_size", "draft_layers", "max_length"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_steps is not None and args.max_steps < 1:
        raise UserError("--max-steps must be at least 1")
    if args.mode == "dflash" and args.block_size < 2:
        raise UserError("--block-size must be at least 2")
    if args.gamma is None:
        args.gamma = gamma_for_block(args.block_size)
    if args.gamma <= 0:
        raise UserError("--gamma must be positive")
    if args.num_anchors < 1:
        raise UserError("--num-anchors must be at least 1")
    if args.batch_size is None and args.batch_tokens is None:
        args.batch_size = 1
    if args.num_workers is None:
        args.num_workers = 0 if args.online else 2
    if args.num_workers < 0:
        raise UserError("--num-workers must be at least 0")
    for key, value in MODE_DEFAULTS[args.mode].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        args.betas = [float(x) for x in str(args.betas).split(",")]
        assert len(args.betas) == 2
    except (ValueError, AssertionError):
        raise UserError(f"--betas {args.betas!r}: expected two numbers like 0.9,0.95") from None
    if args.noise_end is None:
        args.noise_end = args.noise_start
    if args.aux_layers is not None and not isinstance(args.aux_layers, list):
        try:
            args.aux_layers = [int(x) for x in args.aux_layers.split(",") if x.strip()]
        except ValueError:
            raise UserError(f"--aux-layers {args.aux_layers!r}: expected comma-separated integers") from None


def _mask_token_id(args, target_cfg) -> int:
    if args.mask_token_id is not None:
        if not 0 <= args.mask_token_id < target_cfg.vocab_size:
            raise UserError(f"--mask-token-id {args.mask_token_id} is outside the target vocabulary ({target_cfg.vocab_size})")
        return args.mask_token_id
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.target, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError):
        tok = None
    if tok is not None:
        if tok.mask_token_id is not None and tok.mask_token_id < target_cfg.vocab_size:
            return int(tok.mask_token_id)
        mask = tok.convert_tokens_to_ids("<|MASK|>")
        if isinstance(mask, int) and mask != tok.unk_token_id and 0 <= mask < target_cfg.vocab_size:
            return mask
        if len(tok) < target_cfg.vocab_size:
            return len(tok)  # an embedding row no token uses
        if tok.pad_token_id is not None:
            return int(tok.pad_token_id)
    if isinstance(target_cfg.pad_token_id, int):
        return target_cfg.pad_token_id
    raise UserError(f"{args.target}: no mask, spare or pad token for DFlash; give --mask-token-id")


class Trainer:
    """One training run (all ranks): data, model, optimiser, loop, checkpoints, export."""

    def __init__(self, args, info: DistInfo, log):
        self.args, self.info, self.log = args, info, log
        self.out = Path(args.out)
        self.device = info.device
        dtype = args.dtype or ("bfloat16" if self.device.type == "cuda" else "float32")
        self.autocast = (torch.autocast(self.device.type, dtype=torch.bfloat16) if dtype == "bfloat16" else nullcontext())
        self.compute_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        self.target_cfg = load_target_config(args.target, trust_remote_code=args.trust_remote_code)
        self._load_data()
        self._build_model()

    # ---- data -----------------------------------------------------------------------------
    def _load_data(self) -> None:
        a = self.args
        num_layers = self.target_cfg.num_hidden_layers
        if a.online:
            from trainer.hidden_states import TargetHiddenStates, check_aux_layers, default_aux_layers

            self.source = TokenizedSource(a.data, max_length=a.max_length, max_samples=a.max_samples)
            layers = a.aux_layers or default_aux_layers(num_layers, a.mode)
            self.aux_layers = check_aux_layers(layers, num_layers)
            self.online = TargetHiddenStates(a.target, self.aux_layers, dtype=self.compute_dtype, device=self.device,
                                             device_map=a.device_map, trust_remote_code=a.trust_remote_code,
                                             return_logits=a.mode == "eagle3")
        else:
            if a.aux_layers:
                raise UserError("--aux-layers is for --online; offline hidden states fix their layers")
            self.source = HiddenStateSource(a.hidden_states, max_length=a.max_length, max_samples=a.max_samples)
            meta = self.source.meta
            if int(meta["hidden_size"]) != self.target_cfg.hidden_size:
                raise UserError(f"{a.hidden_states}: hidden size {meta['hidden_size']} but the target has "
                                f"{self.target_cfg.hidden_size}; extracted from another model?")
            self.aux_layers = [int(i) for i in meta["aux_layers"]]
            self.online = None
        if a.mode == "eagle3" and len(self.aux_layers) != 3:
            raise UserError(f"EAGLE-3 fuses 3 aux layers; the data has {len(self.aux_layers)} ({self.aux_layers})")
        self.sampler = BucketBatchSampler(self.source.lengths, batch_size=a.batch_size, batch_tokens=a.batch_tokens,
                                          num_buckets=a.num_buckets, seed=a.seed, rank=self.info.rank,
                                          world_size=self.info.world_size)
        per_epoch = [len(self.sampler.epoch_batches(e)) for e in range(a.epochs)]
        self.total_steps = sum(per_epoch) if a.max_steps is None else min(a.max_steps, sum(per_epoch))

    # ---- model ----------------------------------------------------------------------------
    def _build_model(self) -> None:
        a = self.args
        embed, head = load_embed_and_head(a.target)
        if a.mode == "eagle3":
            from trainer.vocab import load_draft_vocab

            d2t, t2d = load_draft_vocab(a.vocab)
            if t2d.numel() != self.target_cfg.vocab_size:
                raise UserError(f"{a.vocab}: t2d covers {t2d.numel()} tokens but the target vocabulary has "
                                f"{self.target_cfg.vocab_size}; built for another model?")
            cfg = Eagle3Config.from_target(self.target_cfg, draft_vocab_size=d2t.numel(), aux_layer_ids=self.aux_layers,
                                           ttt_length=a.ttt_length)
            model = init_drafter(cfg, embed, head, d2t=d2t, t2d=t2d, seed=a.seed)
            self.head = head.to(self.device, self.compute_dtype) if self.online is None else None
        else:
            cfg = DFlashConfig.from_target(self.target_cfg, target_layer_ids=self.aux_layers,
                                           mask_token_id=_mask_token_id(a, self.target_cfg), block_size=a.block_size,
                                           num_layers=a.draft_layers)
            model = init_drafter(cfg, embed, head, seed=a.seed)
            self.slot_weights = dflash_slot_weights(a.block_size, a.gamma).to(self.device)
            self.noise = NoiseSchedule(a.noise_start, a.noise_end, a.noise_warmup_steps, self.total_steps)
        self.model_cfg = cfg
        self.frozen = model.frozen
        self.model = wrap_model(model.to(self.device), self.info, fsdp=a.fsdp)
        self.optimizer = build_optimizer(self.model, a.lr, betas=a.betas, weight_decay=a.weight_decay)
        self.scheduler = build_scheduler(self.optimizer, total_steps=self.total_steps,
                                         warmup_steps=warmup_steps_for(self.total_steps, a.warmup_ratio),
                                         min_ratio=a.min_lr_ratio)
        seed = a.seed * 1000 + self.info.rank
        self.generators = {"cpu": torch.Generator().manual_seed(seed),
                           "device": torch.Generator(device=self.device).manual_seed(seed)}
        self.step = 0

    # ---- one step -------------------------------------------------------------------------
    def _features(self, batch):
        """(aux features, target logits or None) of a batch, no grad."""
        with torch.no_grad():
            if self.online is not None:
                aux, _last, logits = self.online(batch["input_ids"], batch["attention_mask"])
                return aux, logits
            aux = batch["aux"]
            if self.args.mode == "eagle3":
                return aux, torch.matmul(batch["last"].to(self.compute_dtype), self.head.T)
            return aux, None

    def _loss(self, batch) -> tuple[torch.Tensor, Stats]:
        a = self.args
        aux, target_logits = self._features(batch)
        if a.mode == "eagle3":
            plain = unwrap(self.model)
            step_logits = self.model(aux, batch["input_ids"], a.ttt_length)
            probs, pmask = eagle3_targets(target_logits, batch["loss_mask"], plain.draft_ids(), plain.t2d)
            loss, plosses = eagle3_loss(step_logits, probs, pmask, a.ttt_decay)
            stats = eagle3_stats(step_logits, probs, pmask)
            for i, pl in enumerate(plosses):
                stats.add(f"ploss_{i}", pl.detach(), 1)
            return loss, stats
        strength = self.noise(self.step)
        aux = add_feature_noise(aux, strength, self.generators["device"])
        lengths = batch["lengths"].tolist()
        lm = batch["loss_mask"].bool()  # anchor positions: loss_mask[t] and loss_mask[t+1], t >= 1
        available = int((lm[:, 1:-1] & lm[:, 2:]).sum(1).max()) if lm.shape[1] > 2 else 0
        anchors = max(1, min(a.num_anchors, available))
        blocks = build_blocks(batch["input_ids"], batch["loss_mask"], lengths, block_size=a.block_size,
                              num_anchors=anchors, mask_token_id=self.model_cfg.mask_token_id,
                              generator=self.generators["cpu"])
        valid = blocks["label_valid"]
        b, t = batch["input_ids"].shape
        ctx_pos = torch.arange(t, device=self.device)[None].expand(b, t)
        logits = self.model(aux, blocks["block_ids"], ctx_pos, blocks["block_positions"], blocks["mask"], valid.flatten(1))
        labels = blocks["labels"][valid]
        loss = weighted_cross_entropy(logits, labels, self.slot_weights.expand_as(valid)[valid])
        stats = dflash_stats(logits, blocks["labels"], valid)
        stats.add("noise", strength, 1)
        return loss, stats

    def train_step(self, batch_ids, batch: dict | None = None) -> tuple[torch.Tensor, Stats]:
        """One optimiser step on a batch (collated here unless the loader already did)."""
        if batch is None:
            batch = collate([self.source[i] for i in batch_ids])
        batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        lr = self.optimizer.param_groups[0]["lr"]
        with self.autocast:
            loss, stats = self._loss(batch)
        loss.backward()
        grad_norm = clip_gradients(self.model, self.args.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        stats.add("loss", loss.detach(), 1)
        stats.add("grad_norm", grad_norm.detach().float(), 1)
        stats.add("lr", lr, 1)
        stats.add("tokens", float(batch["lengths"].sum()), 0)
        return loss.detach(), stats

    # ---- checkpoints ----------------------------------------------------------------------
    def payload(self) -> dict:
        return {"args": vars(self.args), "mode": self.args.mode, "model_config": self.model_cfg.to_dict(),
                "total_steps": self.total_steps, "world_size": self.info.world_size}

    def save(self) -> Path:
        return save_checkpoint(self.out, self.step, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                               sampler=self.sampler, info=self.info, payload=self.payload(), generators=self.generators,
                               frozen=self.frozen, keep=self.args.keep_checkpoints)

    def resume(self) -> None:
        state, rng = load_checkpoint(self.out, self.info.rank)
        saved = state["args"]
        changed = [k for k in RESUME_FIXED if saved.get(k) != vars(self.args).get(k)]
        if state["mode"] != self.args.mode or changed:
            raise UserError(f"{state['path']}: cannot resume with different {', '.join(changed or ['mode'])} "
                            f"(checkpoint has {', '.join(f'{k}={saved.get(k)!r}' for k in changed or ['mode'])})")
        if state["model_config"] != self.model_cfg.to_dict():
            raise UserError(f"{state['path']}: the checkpoint's drafter config differs from this run's")
        if state.get("world_size", 1) != self.info.world_size:
            raise UserError(f"{state['path']}: saved with {state.get('world_size')} ranks, now {self.info.world_size};"
                            " resume with the same number of processes (the data order is sharded by rank)")
        load_full_state(self.model, self.optimizer, state["model"], state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state(state["sampler"])
        self.step = int(state["step"])
        if rng is not None:
            set_rng_state(rng, self.generators)
        else:
            self.log(f"resume: no RNG state for rank {self.info.rank} in {state['path']}; reseeding")
            for g in self.generators.values():
                g.manual_seed(self.args.seed * 1000 + self.info.rank + 7919 * self.step)
        self.log(f"resumed from {state['path']} at step {self.step} (epoch {self.sampler.epoch}, "
                 f"batch {self.sampler.position})")

    # ---- loop -----------------------------------------------------------------------------
    stop_requested = False

    def _stop_agreed(self) -> bool:
        """True on every rank once any rank got SIGTERM/SIGINT (ranks must stop at the same step)."""
        flag = torch.tensor([1.0 if Trainer.stop_requested else 0.0])
        if self.info.enabled:
            flag = all_reduce_sum(flag, self.info)
        return bool(flag.item() > 0)

    def _batches(self):
        """(ids, collated batch) for the rest of the epoch, read ahead by `--num-workers` processes."""
        todo = self.sampler.remaining()
        if self.args.num_workers == 0:
            return ((ids, None) for ids in todo)
        loader = torch.utils.data.DataLoader(self.source, batch_sampler=todo, collate_fn=collate,
                                             num_workers=self.args.num_workers, prefetch_factor=4,
                                             pin_memory=self.device.type == "cuda")
        return zip(todo, loader)

    def epoch_progress(self) -> float:
        n = len(self.sampler.epoch_batches(self.sampler.epoch)) or 1
        return round(self.sampler.epoch + self.sampler.position / n, 6)

    def run(self, metrics: MetricsWriter | None, on_step=None) -> dict:
        a = self.args
        t_start = time.monotonic()
        t_log, window = time.monotonic(), Stats()
        tokens_total = 0.0
        last_record: dict = {}
        reduce = (lambda flat: all_reduce_sum(flat, self.info)) if self.info.enabled else None
        while self.step < self.total_steps and self.sampler.epoch < a.epochs:
            for batch_ids, batch in self._batches():
                self.sampler.consumed()
                loss, stats = self.train_step(batch_ids, batch)
                window.merge(stats)
                final = self.step >= self.total_steps
                if self.step % a.log_every == 0 or final:
                    totals = window.totals(reduce)
                    now = time.monotonic()
                    tokens = totals.pop("tokens")[0]
                    tokens_total += tokens
                    record = {"step": self.step, "total_steps": self.total_steps, "epoch": self.epoch_progress(),
                              **{k: num / den for k, (num, den) in totals.items() if den > 0},
                              "tokens_per_s": tokens / max(now - t_log, 1e-9), "tokens": tokens_total,
                              "elapsed_s": round(now - t_start, 3)}
                    if self.info.is_main:
                        if metrics is not None:
                            metrics.write(record)
                        self.log(_summary_line(record, self.total_steps))
                    last_record, window, t_log = record, Stats(), now
                if a.save_every and self.step % a.save_every == 0 and not final:
                    self.save()
                if on_step is not None:
                    on_step(self, batch_ids, float(loss))
                if final:
                    break
                if self._stop_agreed():
                    path = self.save()
                    raise Stopped(f"stopped by signal at step {self.step}; checkpoint {path}; continue with --resume")
        return {"last": last_record, "elapsed_s": round(time.monotonic() - t_start, 3), "tokens": tokens_total}


class Stopped(NodedeckError):
    """Training stopped on request after saving a checkpoint."""


def _request_stop(signum, _frame) -> None:
    """First SIGTERM/SIGINT: checkpoint and stop at the next step boundary; a second one: die now."""
    if Trainer.stop_requested:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    Trainer.stop_requested = True


def _summary_line(r: dict, total: int) -> str:
    keys = [k for k in ("loss", "acc_0", "accept_len", "lr", "grad_norm", "tokens_per_s") if k in r]
    return f"step {r['step']}/{total} " + " ".join(f"{k} {r[k]:.4g}" for k in keys)


def run(argv=None, *, on_step=None, log=None) -> dict:
    """Parse arguments and train (the Python API behind the CLI); returns the done.json record."""
    args = build_parser().parse_args(argv)
    _check_args(args)
    info = init_distributed(args.device, args.dist_timeout)
    log = log or (lambda msg: print(f"[rank {info.rank}] {msg}" if info.enabled else msg, file=sys.stderr, flush=True))
    try:
        return _train(args, info, log, on_step)
    finally:
        cleanup(info)


def _train(args, info: DistInfo, log, on_step) -> dict:
    from trainer.checkpoint import drafter_from_checkpoint
    from trainer.export import export_drafter

    out = Path(args.out)
    random.seed(args.seed)
    np.random.seed(args.seed)
    if not args.resume and (out / "checkpoints" / "latest").exists():
        raise UserError(f"{out} already holds checkpoints; pass --resume to continue or use another --out")
    trainer = Trainer(args, info, log)
    if args.resume:
        trainer.resume()
    metrics = None
    metrics_path = Path(args.metrics) if args.metrics else out / "metrics.jsonl"
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "done.json").unlink(missing_ok=True)
        write_json(out / "run.json", {"args": vars(args), "world_size": info.world_size, "pid": os.getpid(),
                                      "started": round(time.time(), 3), "total_steps": trainer.total_steps,
                                      "resumed_from_step": trainer.step})
        metrics = MetricsWriter(metrics_path, wandb_project=args.wandb_project, tensorboard_dir=args.tensorboard_dir,
                                run_name=out.name, config=vars(args), log=log)
        if args.resume:
            metrics.truncate_after(trainer.step)
        else:
            metrics_path.unlink(missing_ok=True)
    Trainer.stop_requested = False
    previous = {sig: signal.signal(sig, _request_stop) for sig in (signal.SIGTERM, signal.SIGINT)} \
        if threading.current_thread() is threading.main_thread() else {}
    if args.mode == "dflash":
        if args.vocab:
            log("dflash predicts over the target vocabulary with the target's lm_head; --vocab is not used")
        log(f"dflash: block size {args.block_size}, gamma {args.gamma:g}, up to {args.num_anchors} anchors per "
            f"sequence, {args.draft_layers} draft layers")
    log(f"training {args.mode}: {len(trainer.source)} samples, {trainer.total_steps} steps, "
        f"{info.world_size} rank(s) on {info.device}")
    try:
        result = trainer.run(metrics, on_step)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if metrics is not None:
            metrics.close()
    checkpoint = trainer.save()
    done = None
    if info.is_main:
        model, summary = drafter_from_checkpoint(checkpoint)
        final = export_drafter(model, out / "final", dtype=args.export_dtype, summary=summary)
        done = {"status": "completed", "mode": args.mode, "steps": trainer.step, "total_steps": trainer.total_steps,
                "epochs": trainer.epoch_progress(), "samples": len(trainer.source), "world_size": info.world_size,
                "tokens": result["tokens"], "elapsed_s": result["elapsed_s"], "final_loss": result["last"].get("loss"),
                "final_accept_len": result["last"].get("accept_len"), "last": result["last"],
                "export": str(final), "checkpoint": str(checkpoint), "metrics": str(metrics_path),
                "finished": round(time.time(), 3)}
        write_json(out / "done.json", done)
        log(f"done: {trainer.step} steps, export in {final}")
    return done


@step_main
def main(argv=None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())

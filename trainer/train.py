"""Train an EAGLE-3 or DFlash drafter on target hidden states (offline shards or the target online).

    python -m trainer.train --mode eagle3|dflash --target DIR [--vocab draft_vocab.safetensors]
        (--hidden-states DIR | --online --data tokenized.jsonl) --out OUT [options]
    torchrun --nproc-per-node 8 -m trainer.train ...     (DDP; add --fsdp to shard large drafters)

Writes under OUT: run.json (arguments, world size, start), metrics.jsonl (one flat JSON object per
logged step: step, epoch, loss, lr, grad_norm, tokens_per_s, acc_i, top4_acc, top8_acc,
streak_top1/4/8, accept_len, EAGLE-3 ploss_i, DFlash noise), checkpoints/ (see trainer.checkpoint),
final/ (the SGLang export, see trainer.export) and, last of all, done.json (the completion record;
with several DDP ranks, `replica_sha256` holds each rank's digest of its final weights, all equal).
Only global rank 0 writes OUT (on several nodes, the first node's OUT). Rank 0 also appends
optimiser-step progress records to --progress or $NODEDECK_PROGRESS (trainer.progress).

Settings are validated once into a frozen TrainConfig (trainer.train_config); what differs between
EAGLE-3 and DFlash lives in one objective class each (trainer.objectives).
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
from trainer.batching import BucketBatchSampler, collate
from trainer.checkpoint import drafter_from_checkpoint, load_for_resume, save_checkpoint, set_rng_state
from trainer.cli import step_main
from trainer.distributed import (
    DistInfo,
    all_gather_objects,
    all_reduce_sum,
    from_main,
    load_full_state,
    process_group,
    unwrap,
    weights_sha256,
    wrap_model,
)
from trainer.export import export_drafter
from trainer.hidden_states.capture import (
    TargetHiddenStates,
    check_aux_layers,
    default_aux_layers,
)
from trainer.jsonl import write_json
from trainer.metrics import MetricsWriter, Stats
from trainer.models.target import load_embed_and_head, load_target_config
from trainer.objectives import OBJECTIVES
from trainer.optim import (
    build_optimizer,
    build_scheduler,
    clip_gradients,
    warmup_steps_for,
)
from trainer.progress import ProgressWriter
from trainer.sources import HiddenStateSource, Source, TokenizedSource
from trainer.train_config import RESUME_FIXED, TrainConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nodedeck-train train", description=__doc__.splitlines()[0])
    a = p.add_argument
    a("--mode", required=True, choices=["eagle3", "dflash"])
    a("--target", "--model", dest="target", required=True,
      help="target model directory (config, tokenizer, safetensors)")
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
    a("--max-nonfinite-steps", type=int, default=8,
      help="skip the update of a step whose loss or gradient norm is NaN/inf (on any rank); stop after this many "
           "such steps in a row")
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
    a("--progress", help="progress JSONL, optimiser steps (default $NODEDECK_PROGRESS; rank 0 only)")
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


class Trainer:
    """One training run (all ranks): data, model, optimiser, loop, checkpoints; the objective owns the mode."""

    def __init__(self, cfg: TrainConfig, info: DistInfo, log):
        self.cfg, self.info, self.log = cfg, info, log
        self.objective = OBJECTIVES[cfg.mode](cfg)
        self.out = Path(cfg.out)
        self.device = info.device
        dtype = cfg.dtype or ("bfloat16" if self.device.type == "cuda" else "float32")
        self.autocast = (torch.autocast(self.device.type, dtype=torch.bfloat16) if dtype == "bfloat16"
                         else nullcontext())
        self.compute_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        self.target_cfg = load_target_config(cfg.target, trust_remote_code=cfg.trust_remote_code)
        self._load_data()
        self._build_model()

    # ---- data -----------------------------------------------------------------------------
    def _load_data(self) -> None:
        c = self.cfg
        self.source: Source
        self.online: TargetHiddenStates | None = None  # the target run on every batch (--online)
        num_layers = self.target_cfg.num_hidden_layers
        if c.online:
            self.source = TokenizedSource(c.data, max_length=c.max_length, max_samples=c.max_samples)
            layers = list(c.aux_layers or default_aux_layers(num_layers, c.mode))
            self.aux_layers = check_aux_layers(layers, num_layers)
            self.online = TargetHiddenStates(c.target, self.aux_layers, dtype=self.compute_dtype, device=self.device,
                                             device_map=c.device_map, trust_remote_code=c.trust_remote_code,
                                             return_logits=self.objective.needs_target_logits)
        else:
            if c.aux_layers:
                raise UserError("--aux-layers is for --online; offline hidden states fix their layers")
            hidden = HiddenStateSource(c.hidden_states, max_length=c.max_length, max_samples=c.max_samples)
            self.source = hidden
            meta = hidden.meta
            if int(meta["hidden_size"]) != self.target_cfg.hidden_size:
                raise UserError(f"{c.hidden_states}: hidden size {meta['hidden_size']} but the target has "
                                f"{self.target_cfg.hidden_size}; extracted from another model?")
            self.aux_layers = [int(i) for i in meta["aux_layers"]]
        self.objective.check_aux_layers(self.aux_layers)
        self.sampler = BucketBatchSampler(self.source.lengths, batch_size=c.batch_size, batch_tokens=c.batch_tokens,
                                          num_buckets=c.num_buckets, seed=c.seed, rank=self.info.rank,
                                          world_size=self.info.world_size)
        per_epoch = [len(self.sampler.epoch_batches(e)) for e in range(c.epochs)]
        self.total_steps = sum(per_epoch) if c.max_steps is None else min(c.max_steps, sum(per_epoch))

    # ---- model ----------------------------------------------------------------------------
    def _build_model(self) -> None:
        c = self.cfg
        embed, head = load_embed_and_head(c.target)
        model = self.objective.build(self.target_cfg, self.aux_layers, embed, head, online=self.online is not None,
                                     device=self.device, compute_dtype=self.compute_dtype,
                                     total_steps=self.total_steps)
        self.model_cfg = model.cfg
        self.frozen = model.frozen
        self.model = wrap_model(model.to(self.device), self.info, fsdp=c.fsdp)
        self.optimizer = build_optimizer(self.model, c.lr, betas=list(c.betas), weight_decay=c.weight_decay)
        self.scheduler = build_scheduler(self.optimizer, total_steps=self.total_steps,
                                         warmup_steps=warmup_steps_for(self.total_steps, c.warmup_ratio),
                                         min_ratio=c.min_lr_ratio)
        seed = c.seed * 1000 + self.info.rank
        self.generators = {"cpu": torch.Generator().manual_seed(seed),
                           "device": torch.Generator(device=self.device).manual_seed(seed)}
        self.step = 0
        self.nonfinite_streak = 0  # non-finite steps skipped in a row (every rank agrees on them)
        self.nonfinite_total = 0

    # ---- one step -------------------------------------------------------------------------
    def _features(self, batch):
        """(aux features, target logits or None) of a batch, no grad: the teacher signal is never trained."""
        with torch.no_grad():
            if self.online is not None:
                aux, _last, logits = self.online(batch["input_ids"], batch["attention_mask"])
                return aux, logits
            return batch["aux"], self.objective.offline_target_logits(batch, self.compute_dtype)

    def _loss(self, batch) -> tuple[torch.Tensor, Stats]:
        aux, target_logits = self._features(batch)
        return self.objective.loss(self.model, aux, target_logits, batch, step=self.step, generators=self.generators)

    def train_step(self, batch_ids, batch: dict | None = None) -> tuple[torch.Tensor, Stats]:
        """One optimiser step on a batch (collated here unless the loader already did)."""
        if batch is None:
            batch = collate([self.source[i] for i in batch_ids])
        batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        lr = self.optimizer.param_groups[0]["lr"]  # the rate this step uses, read before the scheduler moves it
        # Forward under bf16 autocast on CUDA (weights stay fp32 in the optimiser); no gradient accumulation:
        # a step is one batch per rank, sized by --batch-size or --batch-tokens, and DDP/FSDP average the
        # gradients across ranks inside backward().
        with self.autocast:
            loss, stats = self._loss(batch)
        loss.backward()
        # Clip the global gradient norm (1.0 by default) so one long or odd batch cannot blow up the
        # drafter early in training; the pre-clip norm is logged as grad_norm.
        grad_norm = clip_gradients(self.model, self.cfg.max_grad_norm)
        # A NaN/inf loss or gradient norm on any rank skips the update on every rank (clipping by a NaN
        # norm would spread NaN into every weight); the ranks agree over one all-reduce of a flag.
        finite = self._finite_agreed(loss, grad_norm)
        if finite:
            self.optimizer.step()
            self.nonfinite_streak = 0
        else:
            self._skip_nonfinite(loss, grad_norm)
            stats = Stats()
        # Linear warmup then cosine decay, advanced once per optimiser step (not per sample or epoch), so
        # the schedule is the same whatever the batch size; its length is total_steps.
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)  # None, not zeros: frees the gradient memory between steps
        self.step += 1
        if finite:
            stats.add("loss", loss.detach(), 1)
            stats.add("grad_norm", grad_norm.detach().float(), 1)
        stats.add("lr", lr, 1)
        stats.add("tokens", float(batch["lengths"].sum()), 0)
        return loss.detach(), stats

    def _finite_agreed(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
        """True on every rank when the loss and gradient norm are finite on every rank."""
        bad = (~torch.isfinite(loss.detach().float())) | (~torch.isfinite(grad_norm.detach().float()))
        flag = bad.float().reshape(1).cpu()
        if self.info.enabled:
            flag = all_reduce_sum(flag, self.info)
        return bool(flag.item() == 0)

    def _skip_nonfinite(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Count a skipped step; stop every rank (they all get here together) after too many in a row."""
        self.nonfinite_streak += 1
        self.nonfinite_total += 1
        limit = self.cfg.max_nonfinite_steps
        self.log(f"step {self.step + 1}: non-finite loss {float(loss.detach()):.4g} or grad norm "
                 f"{float(grad_norm.detach()):.4g} on some rank; update skipped ({self.nonfinite_streak} in a row, "
                 f"{self.nonfinite_total} in all)")
        if self.nonfinite_streak >= limit:
            raise NonFinite(f"{self.nonfinite_streak} steps in a row had a non-finite loss or gradient norm "
                            f"(up to step {self.step + 1}); stopped without saving. Lower --lr, check the data, "
                            f"or resume from the last checkpoint (--max-nonfinite-steps {limit})")

    # ---- checkpoints ----------------------------------------------------------------------
    def payload(self) -> dict:
        return {"args": self.cfg.to_dict(), "mode": self.cfg.mode, "model_config": self.model_cfg.to_dict(),
                "total_steps": self.total_steps, "world_size": self.info.world_size}

    def save(self) -> Path:
        return save_checkpoint(self.out, self.step, model=self.model, optimizer=self.optimizer,
                               scheduler=self.scheduler,
                               sampler=self.sampler, info=self.info, payload=self.payload(), generators=self.generators,
                               frozen=self.frozen, keep=self.cfg.keep_checkpoints)

    def resume(self) -> None:
        state, rng = load_for_resume(self.out, self.info)   # read on rank 0: nodes need not share a disk
        saved, now = state["args"], self.cfg.to_dict()
        changed = [k for k in RESUME_FIXED if saved.get(k) != now.get(k)]
        if state["mode"] != self.cfg.mode or changed:
            raise UserError(f"{state['path']}: cannot resume with different {', '.join(changed or ['mode'])} "
                            f"(checkpoint has {', '.join(f'{k}={saved.get(k)!r}' for k in changed or ['mode'])})")
        if state["model_config"] != self.model_cfg.to_dict():
            raise UserError(f"{state['path']}: the checkpoint's drafter config differs from this run's")
        if state.get("world_size", 1) != self.info.world_size:
            raise UserError(f"{state['path']}: saved with {state.get('world_size')} ranks, now {self.info.world_size};"
                            " resume with the same number of processes (the data order is sharded by rank)")
        load_full_state(self.model, self.optimizer, state["model"], state["optimizer"], from_rank0=self.info.enabled)
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state(state["sampler"])
        self.step = int(state["step"])
        if rng is not None:
            set_rng_state(rng, self.generators)
        else:
            self.log(f"resume: no RNG state for rank {self.info.rank} in {state['path']}; reseeding")
            for g in self.generators.values():
                g.manual_seed(self.cfg.seed * 1000 + self.info.rank + 7919 * self.step)
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
        if self.cfg.num_workers == 0:
            return ((ids, None) for ids in todo)
        loader = torch.utils.data.DataLoader(self.source, batch_sampler=todo, collate_fn=collate,
                                             num_workers=self.cfg.num_workers, prefetch_factor=4,
                                             pin_memory=self.device.type == "cuda")
        return zip(todo, loader)

    def epoch_progress(self) -> float:
        n = len(self.sampler.epoch_batches(self.sampler.epoch)) or 1
        return round(self.sampler.epoch + self.sampler.position / n, 6)

    def run(self, metrics: MetricsWriter | None, on_step=None, progress: ProgressWriter | None = None) -> dict:
        """Train until total_steps (or the epochs run out); returns the last logged record and totals."""
        c = self.cfg
        t_start = time.monotonic()
        t_log, window = time.monotonic(), Stats()
        tokens_total = 0.0
        last_record: dict = {}
        # Metrics are averaged over all ranks only when logged: one all-reduce per log line, not per step.
        reduce = (lambda flat: all_reduce_sum(flat, self.info)) if self.info.enabled else None
        # The step budget, not the epoch count, ends training (--max-steps may stop mid-epoch); the sampler
        # remembers its epoch and position, so a resumed run continues with the very next batch.
        while self.step < self.total_steps and self.sampler.epoch < c.epochs:
            for batch_ids, batch in self._batches():
                # Mark the batch consumed before the step, so a checkpoint taken after it never replays it.
                self.sampler.consumed()
                loss, stats = self.train_step(batch_ids, batch)
                window.merge(stats)
                final = self.step >= self.total_steps
                if progress is not None:
                    progress.update(self.step)  # time-throttled: at most a line a second
                # Log every --log-every steps, and always the last step: the metrics are sums over the
                # window since the previous line (loss, accuracies, tokens/s), so no step is left out.
                if self.step % c.log_every == 0 or final:
                    totals = window.totals(reduce)
                    now = time.monotonic()
                    tokens = totals.pop("tokens")[0]
                    tokens_total += tokens
                    record = {"step": self.step, "total_steps": self.total_steps, "epoch": self.epoch_progress(),
                              **{k: num / den for k, (num, den) in totals.items() if den > 0},
                              "tokens_per_s": tokens / max(now - t_log, 1e-9), "tokens": tokens_total,
                              "nonfinite_steps": self.nonfinite_total,
                              "elapsed_s": round(now - t_start, 3)}
                    if self.info.is_main:
                        if metrics is not None:
                            metrics.write(record)
                        self.log(_summary_line(record, self.total_steps))
                    last_record, window, t_log = record, Stats(), now
                # Periodic checkpoints bound the work lost to a crash; the last step's checkpoint is saved
                # by the caller, once, before the export.
                if c.save_every and self.step % c.save_every == 0 and not final:
                    self.save()
                if on_step is not None:
                    on_step(self, batch_ids, float(loss))
                if final:
                    break
                # A signal on any rank stops every rank at this same step, after a checkpoint: all ranks
                # must agree, or the next collective would hang the ones still training.
                if self._stop_agreed():
                    path = self.save()
                    raise Stopped(f"stopped by signal at step {self.step}; checkpoint {path}; continue with --resume")
        return {"last": last_record, "elapsed_s": round(time.monotonic() - t_start, 3), "tokens": tokens_total}


class Stopped(NodedeckError):
    """Training stopped on request after saving a checkpoint."""


class NonFinite(NodedeckError):
    """Training stopped: too many steps in a row with a non-finite loss or gradient norm."""


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


def run(argv=None, *, on_step=None, log=None) -> dict | None:
    """Parse arguments and train (the Python API behind the CLI); returns the done.json record (on rank 0;
    None on the other ranks)."""
    cfg = TrainConfig.from_args(build_parser().parse_args(argv))
    with process_group(cfg.device, cfg.dist_timeout) as info:
        log = log or (lambda msg: print(f"[rank {info.rank}] {msg}" if info.enabled else msg, file=sys.stderr,
                                        flush=True))
        return _train(cfg, info, log, on_step)


def _train(cfg: TrainConfig, info: DistInfo, log, on_step) -> dict | None:
    out = Path(cfg.out)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    if not cfg.resume:   # rank 0's OUT is the one that holds checkpoints (trainer.checkpoint)
        from_main(lambda: _refuse_old_checkpoints(out), info)
    trainer = Trainer(cfg, info, log)
    if cfg.resume:
        trainer.resume()
    metrics = None
    metrics_path = Path(cfg.metrics) if cfg.metrics else out / "metrics.jsonl"
    # Ranks step in lockstep, so rank 0's step count is the run's: only rank 0 writes progress.
    progress = ProgressWriter(cfg.progress if info.is_main else False, "train", trainer.total_steps, unit="steps",
                        done=trainer.step)  # a resumed run starts where its checkpoint left off
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "done.json").unlink(missing_ok=True)
        write_json(out / "run.json", {"args": cfg.to_dict(), "world_size": info.world_size, "pid": os.getpid(),
                                      "started": round(time.time(), 3), "total_steps": trainer.total_steps,
                                      "resumed_from_step": trainer.step})
        metrics = MetricsWriter(metrics_path, wandb_project=cfg.wandb_project, tensorboard_dir=cfg.tensorboard_dir,
                                run_name=out.name, config=cfg.to_dict(), log=log)
        if cfg.resume:
            metrics.truncate_after(trainer.step)
        else:
            metrics_path.unlink(missing_ok=True)
    Trainer.stop_requested = False
    previous = {sig: signal.signal(sig, _request_stop) for sig in (signal.SIGTERM, signal.SIGINT)} \
        if threading.current_thread() is threading.main_thread() else {}
    for line in trainer.objective.describe():
        log(line)
    log(f"training {cfg.mode}: {len(trainer.source)} samples, {trainer.total_steps} steps, "
        f"{info.world_size} rank(s) on {info.device}")
    try:
        with progress:
            result = trainer.run(metrics, on_step, progress)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if metrics is not None:
            metrics.close()
    checkpoint = trainer.save()
    replicas = _replica_digests(trainer, info)
    done = None
    if info.is_main:
        model, summary = drafter_from_checkpoint(checkpoint)
        final = export_drafter(model, out / "final", dtype=cfg.export_dtype, summary=summary)
        done = {"status": "completed", "mode": cfg.mode, "steps": trainer.step, "total_steps": trainer.total_steps,
                "epochs": trainer.epoch_progress(), "samples": len(trainer.source), "world_size": info.world_size,
                "tokens": result["tokens"], "elapsed_s": result["elapsed_s"], "final_loss": result["last"].get("loss"),
                "final_accept_len": result["last"].get("accept_len"), "last": result["last"],
                "export": str(final), "checkpoint": str(checkpoint), "metrics": str(metrics_path),
                "replica_sha256": replicas,
                "finished": round(time.time(), 3)}
        write_json(out / "done.json", done)
        log(f"done: {trainer.step} steps, export in {final}")
    return done


def _refuse_old_checkpoints(out: Path) -> None:
    if (out / "checkpoints" / "latest").exists():
        raise UserError(f"{out} already holds checkpoints; pass --resume to continue or use another --out")


def _replica_digests(trainer: Trainer, info: DistInfo) -> list[str] | None:
    """Every rank's sha256 of its own copy of the trained weights (None with one rank, or under FSDP,
    where each rank holds a shard). DDP keeps the copies identical; ranks that drifted apart (on
    other nodes, say) are an error on every rank, after the checkpoint is saved."""
    if not info.enabled or trainer.cfg.fsdp:
        return None
    digests = all_gather_objects(weights_sha256(unwrap(trainer.model)), info)
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    if differ:
        raise NodedeckError(f"after step {trainer.step} the weights of rank(s) {', '.join(map(str, differ))} differ "
                            "from rank 0's: the DDP replicas drifted apart (rank 0's are in the checkpoint)")
    return digests


@step_main
def main(argv=None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    from trainer.rank_exit import end_rank

    sys.exit(end_rank(main()))

"""Training metrics: accuracies, DDTree-style streaks, acceptance length, and the JSONL writer.

Per logged step (flat numbers; the dashboard tails the JSONL):
  acc_i          top-1 accuracy of the (i+1)-th drafted token (EAGLE-3 TTT step i, DFlash slot i+1)
  top4_acc, top8_acc   the label within the drafter's top-k, over all draft positions
  streak_top1, streak_top4, streak_top8   mean length of the accepted prefix of a draft when each
                 position must be the top-1 (or within top-k) choice; a chain starts at every
                 position whose first draft token is scored and stops at the first miss or at the
                 first position that is not scored (past the end, untrained, out of draft vocab)
  accept_len     1 + streak_top1: expected tokens per verification of a chain draft (bonus included)
Ratios are pooled (sum of numerators / sum of denominators) over the logged steps and all ranks.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

TOPK = (4, 8)


def topk_hits(logits: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """Bool [...]: labels[...] among the k highest logits[..., :]."""
    k = min(k, logits.shape[-1])
    return (logits.topk(k, dim=-1).indices == labels[..., None]).any(-1)


def streak(hits: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True along the last dim."""
    return hits.long().cumprod(-1).sum(-1)


class Stats:
    """Pooled ratios: name -> (numerator, denominator), accumulated as tensors (no host syncs)."""

    def __init__(self):
        self.sums: dict[str, list[torch.Tensor]] = {}

    def add(self, name: str, num, den) -> None:
        num, den = torch.as_tensor(num, dtype=torch.float64), torch.as_tensor(den, dtype=torch.float64)
        if name in self.sums:
            self.sums[name][0] = self.sums[name][0] + num.to(self.sums[name][0].device)
            self.sums[name][1] = self.sums[name][1] + den.to(self.sums[name][1].device)
        else:
            self.sums[name] = [num.detach(), den.detach()]

    def merge(self, other: "Stats") -> None:
        for name, (num, den) in other.sums.items():
            self.add(name, num, den)

    def totals(self, reduce=None) -> dict[str, tuple[float, float]]:
        """name -> (numerator, denominator); `reduce` sums the flat tensor across ranks."""
        if not self.sums:
            return {}
        names = sorted(self.sums, key=_natural_key)
        flat = torch.stack([torch.stack([self.sums[n][0].cpu(), self.sums[n][1].cpu()]) for n in names])
        if reduce is not None:
            flat = reduce(flat)
        return {n: (num, den) for n, (num, den) in zip(names, flat.tolist())}

    def means(self, reduce=None) -> dict[str, float]:
        """name -> num/den (names with a zero denominator are left out)."""
        return {n: num / den for n, (num, den) in self.totals(reduce).items() if den > 0}


def _natural_key(name: str):
    head, _, tail = name.rpartition("_")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def chain_stats(top1: torch.Tensor, topk: dict[int, torch.Tensor], valid: torch.Tensor) -> Stats:
    """Stats from hit tensors [..., S] (position i of a chain along the last dim; hits already
    ANDed with `valid`). Chains start where position 0 is valid."""
    stats = Stats()
    valid = valid.bool()
    for i in range(valid.shape[-1]):
        stats.add(f"acc_{i}", top1[..., i].sum(), valid[..., i].sum())
    for k, hits in topk.items():
        stats.add(f"top{k}_acc", hits.sum(), valid.sum())
    starts = valid[..., 0]
    n = starts.sum()
    s1 = streak(top1)[starts]
    stats.add("streak_top1", s1.sum(), n)
    stats.add("accept_len", (s1 + 1).sum(), n)
    for k, hits in topk.items():
        stats.add(f"streak_top{k}", streak(hits)[starts].sum(), n)
    return stats


def eagle3_stats(step_logits, probs, position_mask) -> Stats:
    """Stats of a TTT unroll: step i row t is checked against the target's top token at t+1+i."""
    labels = probs.argmax(-1)
    with torch.no_grad():
        lb = torch.stack([shift_left(labels, 1 + i) for i in range(len(step_logits))], -1)
        ok = torch.stack([shift_left(position_mask, 1 + i) for i in range(len(step_logits))], -1).bool()
        top1 = torch.stack([lg.argmax(-1) for lg in step_logits], -1) == lb
        topk = {k: torch.stack([topk_hits(lg, lb[..., i], k) for i, lg in enumerate(step_logits)], -1) & ok
                for k in TOPK}
        return chain_stats(top1 & ok, topk, ok)


def dflash_stats(logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor) -> Stats:
    """Stats of a block batch: logits [M, V] of the valid slots (in `valid` [..., bs] order)."""
    with torch.no_grad():
        lb = labels[valid.bool()]
        return dflash_hit_stats(logits.argmax(-1) == lb, {k: topk_hits(logits, lb, k) for k in TOPK}, valid)


def dflash_hit_stats(top1: torch.Tensor, topk: dict[int, torch.Tensor], valid: torch.Tensor) -> Stats:
    """dflash_stats from the hits [M] of the valid slots (top-1, and top-k for k in TOPK)."""
    with torch.no_grad():
        valid = valid.bool()

        def scatter(hits):
            full = torch.zeros_like(valid)
            full[valid] = hits
            return full[..., 1:]

        return chain_stats(scatter(top1), {k: scatter(h) for k, h in topk.items()}, valid[..., 1:])


def shift_left(x: torch.Tensor, s: int) -> torch.Tensor:
    """out[:, t] = x[:, t+s], zero past the end."""
    out = torch.zeros_like(x)
    if s < x.shape[1]:
        out[:, : x.shape[1] - s] = x[:, s:]
    return out


class MetricsWriter:
    """Append one flat JSON object per logged step; mirror to wandb/tensorboard when installed.

    wandb is used when `wandb_project` is given and the package imports; tensorboard when
    `tensorboard_dir` is given and torch's SummaryWriter imports. Otherwise one line says so.
    """

    def __init__(self, path, *, wandb_project=None, tensorboard_dir=None, run_name=None, config=None, log=None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._wandb = self._tb = None
        if wandb_project:
            try:
                import wandb  # lazy: optional, in no extra

                self._wandb = wandb.init(project=wandb_project, name=run_name, config=config or {})
            except ImportError:
                self.log("metrics: wandb is not installed; wandb logging disabled")
        if tensorboard_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter  # lazy: optional, in no extra

                self._tb = SummaryWriter(str(tensorboard_dir))
            except ImportError:
                self.log("metrics: tensorboard is not installed; tensorboard logging disabled")

    def write(self, record: dict) -> None:
        record = {"ts": round(time.time(), 3), **record}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        step = int(record["step"])
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if k not in ("step", "ts")}, step=step)
        if self._tb is not None:
            for k, v in record.items():
                if k not in ("step", "ts"):
                    self._tb.add_scalar(k, v, step)

    def truncate_after(self, step: int) -> None:
        """Drop records past `step` (a resumed run rewrites them)."""
        if not self.path.exists():
            return
        keep = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                if int(json.loads(line)["step"]) <= step:
                    keep.append(line)
            except (ValueError, KeyError, TypeError):
                continue
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in keep), encoding="utf-8")
        tmp.replace(self.path)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
        if self._tb is not None:
            self._tb.close()

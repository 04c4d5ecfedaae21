"""Draft vocabulary: the target tokens the drafter predicts, chosen by frequency on loss-masked positions.

Output safetensors (the buffers SGLang's EAGLE-3 loader reads):
    d2t  int64 [draft_vocab]   target id of draft id i is  i + d2t[i]  (draft ids sorted by target id)
    t2d  bool  [target_vocab]  True where the target token is in the draft vocabulary
plus a stats JSON (`OUT` with suffix .json): counts and the share of masked tokens covered.
When the target vocabulary is not larger than the draft size the mapping is the identity.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from ops.errors import UserError
from trainer.cli import step_main
from trainer.jsonl import write_json
from trainer.progress import ProgressWriter
from trainer.tokenized import iter_tokenized


def count_masked_tokens(path, target_vocab_size: int, progress=None) -> Counter:
    """Frequency of each target token id over loss-masked positions of a tokenized JSONL file."""
    counts: Counter = Counter()
    total = sum(1 for _ in Path(path).open("rb")) if Path(path).exists() else None
    with ProgressWriter(progress, "vocab", total) as prog:
        n = 0
        for n, s in enumerate(iter_tokenized(path), 1):
            bad = next((t for t in s.input_ids if t >= target_vocab_size), None)
            if bad is not None:
                raise UserError(f"{path}:{s.line}: token id {bad} is outside the target vocabulary "
                                f"({target_vocab_size})")
            counts.update(t for t, m in zip(s.input_ids, s.loss_mask) if m)
            prog.update(n)
        prog.close()
    if n == 0:
        raise UserError(f"{path}: no samples")
    return counts


def build_draft_vocab(counts: Counter, target_vocab_size: int, draft_vocab_size: int):
    """(d2t int64, t2d bool): the `draft_vocab_size` most frequent ids (ties: lower id first; unseen ids
    fill the remaining slots in id order), sorted ascending; identity when the target is not larger."""
    size = min(draft_vocab_size, target_vocab_size)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    if len(ranked) < size:
        chosen = set(ranked)
        ranked += [t for t in range(target_vocab_size) if t not in chosen][: size - len(ranked)]
    used = torch.tensor(sorted(ranked), dtype=torch.int64)
    d2t = used - torch.arange(size, dtype=torch.int64)
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d


def load_draft_vocab(path) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) from a draft-vocab safetensors file."""
    try:
        tensors = load_file(str(path))
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    if set(tensors) != {"d2t", "t2d"}:
        raise UserError(f"{path}: expected tensors d2t and t2d, found {sorted(tensors)}")
    return tensors["d2t"], tensors["t2d"]


def write_draft_vocab(data, out, *, target_vocab_size: int, draft_vocab_size: int = 32000, progress=None) -> dict:
    """Count, choose, save `out` (safetensors, atomically) and its stats JSON; return the stats."""
    if target_vocab_size < 1 or draft_vocab_size < 1:
        raise UserError("--target-vocab-size and --draft-vocab-size must be positive")
    counts = count_masked_tokens(data, target_vocab_size, progress)
    d2t, t2d = build_draft_vocab(counts, target_vocab_size, draft_vocab_size)
    total = sum(counts.values())
    covered = sum(c for t, c in counts.items() if t2d[t])
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(save({"d2t": d2t, "t2d": t2d}))
    tmp.replace(out)
    stats = {"data": str(data), "target_vocab_size": target_vocab_size, "draft_vocab_size": len(d2t),
             "identity": bool((d2t == 0).all()) and len(d2t) == target_vocab_size,
             "masked_tokens": total, "distinct_masked_tokens": len(counts),
             "coverage": round(covered / total, 6) if total else 0.0}
    write_json(out.with_suffix(".json"), stats)
    return stats


@step_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nodedeck-train vocab", description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="tokenized JSONL")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--target-vocab-size", type=int)
    size.add_argument("--model", help="target model directory (its config.json gives the vocab size)")
    p.add_argument("--draft-vocab-size", type=int, default=32000)
    p.add_argument("--out", required=True, help="draft vocab safetensors to write")
    p.add_argument("--progress", help="progress JSONL file (default $NODEDECK_PROGRESS)")
    args = p.parse_args(argv)
    target = args.target_vocab_size
    if target is None:
        cfg = Path(args.model) / "config.json"
        try:
            target = int(json.loads(cfg.read_text())["vocab_size"])
        except (OSError, ValueError, KeyError) as exc:
            raise UserError(f"{cfg}: cannot read vocab_size ({exc})") from None
    stats = write_draft_vocab(args.data, args.out, target_vocab_size=target,
                              draft_vocab_size=args.draft_vocab_size, progress=args.progress)
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())

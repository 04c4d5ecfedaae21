"""Where training samples come from: a tokenized JSONL file (online) or offline hidden-state shards.

Both are map-style torch datasets of sample dicts (input_ids, loss_mask; offline also aux and last)
with the `lengths` the batch sampler buckets by.
"""

from __future__ import annotations

import torch
from safetensors import safe_open
from torch.utils.data import Dataset

from ops.errors import UserError
from trainer.hidden_states.dataset import HiddenStateDataset
from trainer.tokenized import iter_tokenized


class TokenizedSource(Dataset[dict]):
    """Samples of a tokenized JSONL file (online training: the target runs on every batch)."""

    def __init__(self, path, *, max_length: int, max_samples: int | None = None):
        self.items: list[dict] = []
        for s in iter_tokenized(path, max_samples=max_samples):
            ids, mask = s.input_ids[:max_length], s.loss_mask[:max_length]
            self.items.append({"input_ids": torch.tensor(ids, dtype=torch.long),
                               "loss_mask": torch.tensor(mask, dtype=torch.uint8)})
        if not self.items:
            raise UserError(f"{path}: no samples")
        self.lengths = [len(x["input_ids"]) for x in self.items]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


class HiddenStateSource(Dataset[dict]):
    """Samples of an offline hidden-state directory (trainer.hidden_states), truncated to max_length."""

    def __init__(self, path, *, max_length: int, max_samples: int | None = None):
        self.ds = HiddenStateDataset(path)
        self.meta = self.ds.meta
        self.max_length = max_length
        lengths = []
        for shard in self.meta["shards"]:
            with safe_open(str(self.ds.path / shard["file"]), framework="pt") as f:
                lengths += [f.get_slice(f"{k}.input_ids").get_shape()[0] for k in range(len(shard["ids"]))]
        n = len(lengths) if max_samples is None else min(max_samples, len(lengths))
        if n == 0:
            raise UserError(f"{path}: no samples")
        self.lengths = [min(x, max_length) for x in lengths[:n]]

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict:
        return {k: v[: self.max_length] for k, v in self.ds[i].items()}


Source = TokenizedSource | HiddenStateSource

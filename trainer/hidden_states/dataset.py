"""HiddenStateDataset: a hidden-state directory read lazily, one open shard per process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open

from ops.errors import UserError
from trainer.hidden_states.shards import FORMAT


class HiddenStateDataset(torch.utils.data.Dataset):
    """Read a hidden-state directory lazily: `ds[i] -> {input_ids, loss_mask, aux, last}`."""

    def __init__(self, path):
        self.path = Path(path)
        index = self.path / "index.json"
        try:
            self.meta = json.loads(index.read_text())
        except FileNotFoundError:
            raise UserError(f"{index}: no such file (not a hidden-state directory)") from None
        except json.JSONDecodeError as exc:
            raise UserError(f"{index}:{exc.lineno}: invalid JSON ({exc.msg})") from None
        if self.meta.get("format") != FORMAT:
            raise UserError(f"{index}: format {self.meta.get('format')!r}, expected {FORMAT!r}")
        self._where = [(s["file"], k) for s in self.meta["shards"] for k in range(len(s["ids"]))]
        self.ids = [i for s in self.meta["shards"] for i in s["ids"]]
        self._open = None  # (pid, file, handle): one open shard per process

    def __len__(self) -> int:
        return len(self._where)

    @property
    def num_tokens(self) -> int:
        return sum(s["num_tokens"] for s in self.meta["shards"])

    def _handle(self, file: str):
        pid = os.getpid()
        if self._open is None or self._open[:2] != (pid, file):
            self._open = (pid, file, safe_open(str(self.path / file), framework="pt"))
        return self._open[2]

    def __getitem__(self, i: int) -> dict:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        file, k = self._where[i]
        f = self._handle(file)
        return {name: f.get_tensor(f"{k}.{name}") for name in ("input_ids", "loss_mask", "aux", "last")}

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_open"] = None
        return state

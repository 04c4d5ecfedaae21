"""The tokenized JSONL format: one `{"id", "input_ids": [int], "loss_mask": [0|1]}` per line.

`loss_mask[t] == 1` where token t belongs to an assistant turn (the tokens a drafter learns).
"""

from __future__ import annotations

from dataclasses import dataclass

from ops.errors import UserError
from trainer.jsonl import iter_jsonl


@dataclass
class TokenizedSample:
    id: str
    input_ids: list[int]
    loss_mask: list[int]
    line: int


def check_record(path, lineno: int, obj: dict) -> TokenizedSample:
    """Validate one record; raise UserError `file:line: ...` when it is not a tokenized sample."""
    missing = [k for k in ("id", "input_ids", "loss_mask") if k not in obj]
    if missing:
        raise UserError(
            f"{path}:{lineno}: not a tokenized sample: missing {missing} (fields found: {sorted(obj)})"
        )
    ids, mask = obj["input_ids"], obj["loss_mask"]
    if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask) or not ids:
        raise UserError(f"{path}:{lineno}: input_ids and loss_mask must be non-empty lists of equal length")
    if not all(type(t) is int and t >= 0 for t in ids):
        raise UserError(f"{path}:{lineno}: input_ids must be non-negative integers")
    if not all(m in (0, 1) for m in mask):
        raise UserError(f"{path}:{lineno}: loss_mask must hold only 0 and 1")
    return TokenizedSample(str(obj["id"]), ids, [int(m) for m in mask], lineno)


def iter_tokenized(path, *, max_samples: int | None = None):
    """Yield validated TokenizedSample records in file order (at most max_samples)."""
    count = 0
    for lineno, obj in iter_jsonl(path):
        if max_samples is not None and count >= max_samples:
            return
        yield check_record(path, lineno, obj)
        count += 1

"""Draft vocab mapping against hand-computed examples."""

from __future__ import annotations

import json
from collections import Counter

import torch

from trainer import vocab
from trainer.vocab import build_draft_vocab, load_draft_vocab


def test_hand_computed_mapping(tmp_path, capsys):
    rows = [
        # masked tokens: 7, 7, 2   (3 and 5 are unmasked and must not count)
        {"id": "a", "input_ids": [3, 7, 7, 2, 5], "loss_mask": [0, 1, 1, 1, 0]},
        # masked tokens: 9, 2, 7, 0
        {"id": "b", "input_ids": [5, 5, 9, 2, 7, 0], "loss_mask": [0, 0, 1, 1, 1, 1]},
    ]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "dv" / "draft_vocab.safetensors"
    assert vocab.main(["--data", str(tmp_path / "t.jsonl"), "--target-vocab-size", "10",
                       "--draft-vocab-size", "3", "--out", str(out)]) == 0
    # counts: 7 -> 3, 2 -> 2, 9 -> 1, 0 -> 1 ; top 3 = 7, 2 and (tie 0/9 -> lower id) 0 -> sorted [0, 2, 7]
    d2t, t2d = load_draft_vocab(out)
    assert d2t.dtype == torch.int64 and d2t.tolist() == [0, 1, 5]
    assert t2d.dtype == torch.bool and t2d.tolist() == [i in (0, 2, 7) for i in range(10)]
    assert [i + int(d) for i, d in enumerate(d2t)] == [0, 2, 7]
    stats = json.loads(out.with_suffix(".json").read_text())
    assert stats["masked_tokens"] == 7 and stats["distinct_masked_tokens"] == 4
    assert stats["coverage"] == round(6 / 7, 6) and stats["draft_vocab_size"] == 3 and not stats["identity"]


def test_identity_when_target_vocab_is_smaller():
    d2t, t2d = build_draft_vocab(Counter({3: 5, 1: 2}), target_vocab_size=6, draft_vocab_size=32000)
    assert d2t.tolist() == [0] * 6 and t2d.all() and len(t2d) == 6


def test_unseen_ids_fill_remaining_slots_in_order():
    d2t, t2d = build_draft_vocab(Counter({8: 1}), target_vocab_size=10, draft_vocab_size=3)
    assert [i + int(d) for i, d in enumerate(d2t)] == [0, 1, 8]


def test_out_of_range_token_is_reported_with_line(tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text(json.dumps({"id": "a", "input_ids": [1, 12], "loss_mask": [1, 1]}) + "\n")
    rc = vocab.main(["--data", str(tmp_path / "t.jsonl"), "--target-vocab-size", "10", "--out", str(tmp_path / "v.st")])
    assert rc == 2
    assert capsys.readouterr().err.strip() == (
        f"nodedeck-train: {tmp_path / 't.jsonl'}:1: token id 12 is outside the target vocabulary (10)")
    assert not (tmp_path / "v.st").exists()

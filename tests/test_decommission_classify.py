"""The class rule table: one row per kind of file a drafter-training node holds."""

from __future__ import annotations

import pytest

from ops.decommission.classify import CLASSES, LARGE_JSON, RULES, classify, parse_classes
from ops.errors import UserError

MiB = 1 << 20


@pytest.mark.parametrize(
    "path,size,cls",
    [
        ("run_train.sh", 900, "scripts"),
        ("trainer/extract.py", 9000, "scripts"),
        ("Makefile", 100, "scripts"),
        ("logs/train.log", 5 * MiB, "logs"),
        ("nohup.out", 100, "logs"),
        ("logs/server.log.3", 100, "logs"),
        ("logs/stdout", 100, "logs"),
        ("out/drafter/config.json", 700, "configs"),
        ("out/drafter/generation_config.json", 200, "configs"),
        ("target/tokenizer.json", 30 * MiB, "configs"),
        ("target/tokenizer_config.json", 3000, "configs"),
        ("plan.toml", 3000, "configs"),
        ("configs/sglang.yaml", 300, "configs"),
        ("patches/fix-eagle.patch", 3000, "configs"),
        ("sglang.diff", 3000, "configs"),
        ("model.safetensors.index.json", 40000, "configs"),
        ("data/prep/shard_003.progress.json", 80, "progress"),
        ("runs/train/metrics.jsonl", 50 * MiB, "progress"),
        ("trainer_state.json", 4000, "progress"),
        ("regen/progress_7.jsonl", 9000, "progress"),
        ("eval/results_small.jsonl", 4000, "progress"),
        ("NOTES.md", 400, "notes"),
        ("todo.txt", 100, "notes"),
        ("checkpoints/step-1000/model.safetensors", 800 * MiB, "checkpoints"),
        ("ckpt/epoch_2/optimizer.pt", 1 << 30, "checkpoints"),
        ("checkpoint-500/pytorch_model.bin", 1 << 30, "checkpoints"),
        ("out/drafter/model.safetensors", 400 * MiB, "checkpoints"),
        ("global_step300/mp_rank_00_model_states.bin", 1 << 30, "checkpoints"),
        ("data/sharegpt_regen.jsonl", 3 << 30, "datasets"),
        ("data/small.jsonl", 900, "datasets"),
        ("ultrachat.jsonl", LARGE_JSON, "datasets"),
        ("prepared/train-00000-of-00004.parquet", 300 * MiB, "datasets"),
        ("cache/ds.arrow", 300 * MiB, "datasets"),
        ("tokens/train.bin", 300 * MiB, "datasets"),
        ("hidden_states/shard_00017.safetensors", 2 << 30, "hidden_states"),
        ("hs-layer3/part0.pt", 2 << 30, "hidden_states"),
        ("extract/hidden_states_0001.npy", 2 << 30, "hidden_states"),
        ("hidden_states/progress.json", 90, "progress"),
        ("hidden_states/shard_00017.json", 90, "hidden_states"),
        ("core.12345", 1 << 30, "other"),
        (".bash_history", 100, "other"),
    ],
)
def test_rule_table(path, size, cls):
    assert classify(path, size) == cls


def test_every_rule_names_a_known_class_and_has_a_reason():
    assert {r.cls for r in RULES} <= set(CLASSES)
    assert all(r.why for r in RULES)


def test_parse_classes_accepts_lists_and_dashes_and_rejects_unknown():
    assert parse_classes(["hidden-states,logs", "checkpoints"], "--include") == {"hidden_states", "logs", "checkpoints"}
    with pytest.raises(UserError, match="--exclude weights: unknown class"):
        parse_classes(["weights"], "--exclude")

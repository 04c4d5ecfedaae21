"""The bundled plans' capture and train stages: SGLang's tensor parallelism is a size the target's heads
divide, the smoke run takes the same path as the full one, and training reads the lengths captured."""

from __future__ import annotations

import pytest

from ops.paths import ASSETS
from ops.plan.parse import load_plan
from ops.plan.resolve import substitute
from trainer.hidden_states.capture import default_aux_layers


def _stage(plan, sid):
    return next(s for s in plan.stages if s.id == sid)


def test_sglang_capture_runs_on_a_gpu_count_that_divides_the_heads():
    plan = load_plan(ASSETS / "plans" / "eagle3-sglang.toml")
    stage = _stage(plan, "hidden_states")
    gpus = substitute(stage.env["CUDA_VISIBLE_DEVICES"], plan.vars.get, shell=False).split(",")
    # every rank is one of SGLang's tensor-parallel ranks: 32 (Llama-8B), 40, 64 (Kimi-K2), 128 (DeepSeek-V3) heads
    assert all(heads % len(gpus) == 0 for heads in (32, 40, 64, 128)), gpus
    assert "--nproc-per-node gpu" in stage.command
    assert set(gpus) <= set(substitute("${work_gpus}", plan.vars.get, shell=False).split(","))


@pytest.mark.parametrize("plan_file", ["eagle3-sglang.toml"])
def test_the_capture_smoke_takes_the_full_runs_path(plan_file):
    stage = _stage(load_plan(ASSETS / "plans" / plan_file), "hidden_states")
    for part in ("torchrun --standalone --nproc-per-node gpu --no-python", "--backend ${capture_backend}"):
        assert part in stage.command and part in stage.smoke.command


@pytest.mark.parametrize("plan_file", ["eagle3-sglang.toml", "dflash.toml"])
def test_training_reads_sequences_as_long_as_the_ones_captured(plan_file):
    plan = load_plan(ASSETS / "plans" / plan_file)
    assert "--max-length ${max_length}" in _stage(plan, "tokenize").command
    train = _stage(plan, "train")
    assert "--max-length ${max_length}" in train.command and "--max-length ${max_length}" in train.smoke.command


def test_one_dflash_layer_is_the_middle_one_as_specforge():
    assert default_aux_layers(36, "dflash", 1) == [18]
    assert default_aux_layers(4, "dflash", 1) == [2]

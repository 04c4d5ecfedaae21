"""TrainConfig: built once from the arguments, frozen, defaults resolved, bad values are one-line errors."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from ops.errors import UserError
from trainer.objectives import OBJECTIVES, DFlashObjective, Eagle3Objective
from trainer.train import build_parser
from trainer.train_config import TrainConfig

REPO = Path(__file__).resolve().parents[1]


def parse(*extra):
    return build_parser().parse_args(["--target", "T", "--hidden-states", "HS", "--out", "O", *extra])


def test_built_once_frozen_and_the_arguments_left_alone():
    args = parse("--mode", "dflash", "--block-size", "8", "--aux-layers", "1,2")
    before = copy.deepcopy(vars(args))
    cfg = TrainConfig.from_args(args)
    assert vars(args) == before  # nothing resolved in place
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0
    assert (cfg.gamma, cfg.batch_size, cfg.num_workers, cfg.betas, cfg.aux_layers) == (4.0, 1, 2, (0.9, 0.95), (1, 2))
    assert cfg.to_dict()["betas"] == [0.9, 0.95] and cfg.to_dict()["aux_layers"] == [1, 2]  # as checkpoints store them


def test_mode_defaults_come_from_the_objective():
    assert OBJECTIVES == {"eagle3": Eagle3Objective, "dflash": DFlashObjective}
    eagle = TrainConfig.from_args(parse("--mode", "eagle3", "--vocab", "v"))
    assert (eagle.lr, eagle.warmup_ratio) == (1e-4, 0.015)
    dflash = TrainConfig.from_args(parse("--mode", "dflash", "--lr", "1e-3", "--noise-start", "0.1"))
    assert (dflash.lr, dflash.warmup_ratio, dflash.noise_end) == (1e-3, 0.04, 0.1)


@pytest.mark.parametrize(("extra", "message"), [
    (("--mode", "eagle3"), "--mode eagle3 needs --vocab"),
    (("--mode", "dflash", "--betas", "0.9"), "--betas '0.9': expected two numbers"),
    (("--mode", "dflash", "--betas", "a,b"), "--betas 'a,b': expected two numbers"),
    (("--mode", "dflash", "--block-size", "1"), "--block-size must be at least 2"),
    (("--mode", "dflash", "--gamma", "0"), "--gamma must be positive"),
    (("--mode", "dflash", "--num-anchors", "0"), "--num-anchors must be at least 1"),
    (("--mode", "dflash", "--num-workers", "-1"), "--num-workers must be at least 0"),
    (("--mode", "dflash", "--aux-layers", "1,x"), "--aux-layers '1,x': expected comma-separated integers"),
])
def test_bad_values_are_user_errors(extra, message):
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(")) as info:
        TrainConfig.from_args(parse(*extra))
    assert "\n" not in str(info.value)


def test_validation_survives_python_O(tmp_path):
    """`assert` is stripped by -O: a one-number --betas must still be refused, with one line and exit 2."""
    proc = subprocess.run([sys.executable, "-O", "-m", "trainer.cli", "train", "--mode", "dflash", "--target", "T",
                           "--hidden-states", "HS", "--out", str(tmp_path / "o"), "--betas", "0.9"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "nodedeck-train: --betas '0.9': expected two numbers like 0.9,0.95"

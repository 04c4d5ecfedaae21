"""The training CLI's defaults are the reference's, and the training step really uses them.

Each assertion names a default a reader of the papers and of SpecForge expects; changing a default
(gamma 7 -> 4, betas (0.9, 0.95) -> (0.9, 0.999), 512 anchors, 5 DFlash layers) fails here.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.support.tiny import tiny_target_dir
from tests.test_trainer_hidden_states import dflash_hidden_states
from trainer.distributed import DistInfo, unwrap
from trainer.losses import dflash_slot_weights, gamma_for_block
from trainer.train import Trainer, build_parser
from trainer.train_config import TrainConfig


@pytest.fixture(scope="module")
def hidden(tmp_path_factory):
    root = tmp_path_factory.mktemp("defaults")
    dflash_hidden_states(root, 4, seed=2)
    return root


def args_for(hidden, *extra):
    args = build_parser().parse_args(["--mode", "dflash", "--target", str(tiny_target_dir()), "--hidden-states",
                                      str(hidden / "hs"), "--out", str(hidden / "out"), "--num-workers", "0",
                                      *extra])
    return TrainConfig.from_args(args)


def test_published_gamma_per_block_size():
    assert [gamma_for_block(b) for b in (8, 10, 16)] == [4.0, 5.0, 7.0]
    assert gamma_for_block(12) == pytest.approx(5 + 2 / 3, abs=0.01)  # between 10 and 16


def test_cli_defaults(hidden):
    args = args_for(hidden)
    assert (args.block_size, args.gamma, args.num_anchors, args.draft_layers) == (16, 7.0, 512, 5)
    assert args.betas == (0.9, 0.95)  # the EAGLE reference optimiser
    assert (args.noise_start, args.noise_end, args.noise_warmup_steps) == (0.0, 0.0, 0)
    assert (args.lr, args.warmup_ratio, args.max_grad_norm) == (6e-4, 0.04, 1.0)
    assert args_for(hidden, "--block-size", "8").gamma == 4.0  # derived from the block size
    assert args_for(hidden, "--block-size", "8", "--gamma", "2.5").gamma == 2.5


def test_training_step_uses_the_defaults(hidden):
    trainer = Trainer(args_for(hidden, "--max-steps", "2"), DistInfo(), log=lambda m: None)
    assert trainer.optimizer.param_groups[0]["betas"] == (0.9, 0.95)
    assert torch.equal(trainer.objective.parts.slot_weights, dflash_slot_weights(16, 7.0))
    assert trainer.objective.parts.slot_weights[7].item() == pytest.approx(math.exp(-6 / 7))
    assert len(unwrap(trainer.model).layers) == 5
    seen = []
    handle = unwrap(trainer.model).register_forward_pre_hook(lambda _m, args: seen.append(args))
    batch = [0, 1]
    clean = torch.nn.utils.rnn.pad_sequence([trainer.source[i]["aux"] for i in batch], batch_first=True)
    _loss, stats = trainer.train_step(batch)
    handle.remove()
    feats, block_ids = seen[0][0], seen[0][1]
    assert torch.equal(feats, clean)  # noise is off by default
    assert stats.totals()["noise"] == (0.0, 1)
    lm = torch.nn.utils.rnn.pad_sequence([trainer.source[i]["loss_mask"] for i in batch], batch_first=True).bool()
    available = int((lm[:, 1:-1] & lm[:, 2:]).sum(1).max())
    assert 0 < available < 512 and block_ids.shape == (2, available * 16)  # every anchor position, up to 512


def test_noise_schedule_is_applied_inside_the_step(hidden):
    trainer = Trainer(args_for(hidden, "--max-steps", "4", "--noise-start", "0.4", "--noise-warmup-steps", "2"),
                      DistInfo(), log=lambda m: None)
    seen = []
    handle = unwrap(trainer.model).register_forward_pre_hook(lambda _m, args: seen.append(args[0].clone()))
    clean = trainer.source[3]["aux"][None]
    strengths = []
    for _ in range(3):
        strengths.append(trainer.train_step([3])[1].totals()["noise"][0])
    handle.remove()
    assert strengths == pytest.approx([0.0, 0.2, 0.4])  # ramp over 2 warmup steps, then --noise-start
    assert torch.equal(seen[0], clean)
    for got, strength in zip(seen[1:], strengths[1:]):
        rms = clean.pow(2).mean(-1, keepdim=True).sqrt()
        ratio = ((got - clean) / rms).pow(2).mean().sqrt().item()  # noise std relative to each token's rms
        assert ratio == pytest.approx(strength, rel=0.25)

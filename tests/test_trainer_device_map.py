"""A target spread over several devices (`--device-map`): features come back on the first device of
the map (where the drafter is), and `train` refuses a device map under torchrun as hidden-states does.

CPU has one device, so the map is faked: the input embedding sits on the `meta` device (the "first
GPU"), the decoder layers and head on the CPU (the "last GPUs"). Outputs found on the CPU were left
on the last device of the map."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from ops.errors import UserError
from trainer.hidden_states.capture import TargetHiddenStates
from trainer.models.target import LayerCapture

H, V, L = 8, 16, 4


class _Base(nn.Module):
    """A decoder whose embedding is on another device than its layers, as under a device map."""

    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, H, device="meta")
        self.layers = nn.ModuleList(nn.Linear(H, H) for _ in range(L))

    def forward(self, input_ids=None, attention_mask=None, use_cache=False):
        x = torch.ones(*input_ids.shape, H)  # the embedding's output, moved to the layers' device
        for layer in self.layers:
            x = layer(x)
        return types.SimpleNamespace(last_hidden_state=x)


class _SpreadLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = _Base()
        self.lm_head = nn.Linear(H, V, bias=False)
        self.config = types.SimpleNamespace(num_hidden_layers=L, hidden_size=H,
                                            get_text_config=lambda: types.SimpleNamespace(hidden_size=H,
                                                                                          num_hidden_layers=L))

    def get_decoder(self):
        return self.model

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head


def test_target_hidden_states_returns_everything_on_the_first_device():
    target = TargetHiddenStates(_SpreadLM(), [0, 1, 2], return_logits=True)
    assert target.device.type == "meta"
    aux, last, logits = target(torch.zeros(2, 5, dtype=torch.long))
    assert (aux.device.type, last.device.type, logits.device.type) == ("meta", "meta", "meta")
    assert aux.shape == (2, 5, 3 * H) and logits.shape == (2, 5, V)


def test_layer_capture_concatenates_layers_of_different_devices_on_the_first():
    model = _SpreadLM()
    capture = LayerCapture(model, [0, 2])
    try:
        model.model(input_ids=torch.zeros(1, 3, dtype=torch.long))
        capture.captured[0] = capture.captured[0].to("meta")  # layer 0 on the first GPU, layer 2 on another
        feats = capture.features()
    finally:
        capture.close()
    assert feats.device.type == "meta" and feats.shape == (1, 3, 2 * H)


def test_the_hf_target_loads_straight_onto_its_device(monkeypatch, tmp_path):
    from transformers import AutoModelForCausalLM

    seen = {}

    def fake_from_pretrained(path, **kwargs):
        seen.update(kwargs)
        return _SpreadLM()

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    TargetHiddenStates(tmp_path, [0, 1, 2], device="cpu")
    assert seen["device_map"] == {"": "cpu"}  # not a full copy in host RAM first, then .to(device)


def test_train_refuses_a_device_map_under_torchrun(monkeypatch, tmp_path):
    from trainer.train import run

    monkeypatch.setenv("WORLD_SIZE", "2")
    args = ["--mode", "dflash", "--target", str(tmp_path), "--online", "--data", str(tmp_path / "d.jsonl"),
            "--out", str(tmp_path / "out"), "--device-map", "auto"]
    with pytest.raises(UserError, match="under torchrun every rank loads its own copy"):
        run(args, log=lambda m: None)


def test_train_refuses_a_device_map_offline(tmp_path):
    from trainer.train import run

    args = ["--mode", "dflash", "--target", str(tmp_path), "--hidden-states", str(tmp_path / "hs"),
            "--out", str(tmp_path / "out"), "--device-map", "auto"]
    with pytest.raises(UserError, match="it is for --online"):
        run(args, log=lambda m: None)

"""What the drafters take from the target: its config, token embedding, lm_head and layer features."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Self

import torch
from safetensors import safe_open

from ops.errors import UserError
from trainer.hidden_states.capture import decoder_layers

EMBED_NAMES = ("model.embed_tokens.weight", "embed_tokens.weight", "model.language_model.embed_tokens.weight",
               "language_model.model.embed_tokens.weight", "transformer.wte.weight")
HEAD_NAMES = ("lm_head.weight", "language_model.lm_head.weight")


def load_target_config(target_dir, *, trust_remote_code: bool = False):
    from transformers import AutoConfig  # lazy: transformers: 1.4 s to import

    try:
        config = AutoConfig.from_pretrained(str(target_dir), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise UserError(f"{target_dir}: cannot read the target config ({str(exc).splitlines()[0]})") from None
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def target_architectures(target_dir) -> list[str]:
    """The `architectures` of the target's config.json (the model class servers pick; [] when absent)."""
    try:
        arch = json.loads((Path(target_dir) / "config.json").read_text()).get("architectures")
    except (OSError, json.JSONDecodeError, AttributeError):
        return []
    return [str(a) for a in arch] if isinstance(arch, list) else []


def _weight_files(target_dir: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file holding it (single file or sharded index)."""
    index = target_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise UserError(f"{index}: not a safetensors index ({exc})") from None
        return {name: target_dir / file for name, file in weight_map.items()}
    single = target_dir / "model.safetensors"
    if not single.exists():
        raise UserError(f"{target_dir}: no model.safetensors or model.safetensors.index.json")

    with safe_open(str(single), framework="pt") as f:
        return {name: single for name in f.keys()}


def _read(files: dict[str, Path], names) -> torch.Tensor | None:
    for name in names:
        if name in files:
            with safe_open(str(files[name]), framework="pt") as f:
                return f.get_tensor(name)
    return None


def load_embed_and_head(target_dir) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed_tokens [V,H], lm_head [V,H]) read straight from the target's safetensors (no full load)."""
    target_dir = Path(target_dir)
    files = _weight_files(target_dir)
    embed = _read(files, EMBED_NAMES)
    if embed is None:
        raise UserError(f"{target_dir}: no token embedding among the weights (looked for {', '.join(EMBED_NAMES)})")
    head = _read(files, HEAD_NAMES)
    if head is None:  # tied embeddings
        head = embed
    return embed, head


class LayerCapture:
    """Forward hooks recording the OUTPUT of decoder layers `layer_ids` (the convention of
    trainer.hidden_states: layer i's output is transformers' hidden_states[i + 1], before any final
    norm); `features()` concatenates them in order after each target forward, on the device of the
    model's input embedding."""

    def __init__(self, model, layer_ids):
        _base, layers = decoder_layers(model)
        self.device = model.get_input_embeddings().weight.device  # the first device of a device map
        self.layer_ids = list(layer_ids)
        self.captured: dict[int, torch.Tensor] = {}
        self.handles = [layers[i].register_forward_hook(self._hook(i)) for i in set(self.layer_ids)]

    def _hook(self, i):
        def hook(_module, _args, output):
            self.captured[i] = output[0] if isinstance(output, (tuple, list)) else output
        return hook

    def features(self) -> torch.Tensor:
        """The captured outputs concatenated on the model's first device (layers of a device map differ)."""
        return torch.cat([self.captured[i].to(self.device) for i in self.layer_ids], dim=-1)

    def close(self) -> None:
        for h in self.handles:
            h.remove()


@dataclass(kw_only=True)
class TargetSized:
    """The fields every drafter config takes from its target (see sized_like); each drafter's config
    adds its own. to_dict/from_dict are how checkpoints and exports store it."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    target_hidden_size: int
    target_num_layers: int
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    rope: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Self:
        return cls(**d)


MLA_HEAD_DIM = 128  # drafter attention for MLA targets (DeepSeek-V2/V3, Kimi-K2): 128-dim heads ...
MLA_KV_HEADS = 8    # ... and 8 KV heads, as SpecForge's DeepSeek-V3 drafter config


def attention_shape(target_config) -> tuple[int, int, int]:
    """(heads, kv heads, head_dim) of the drafter's plain GQA attention.

    Llama/Qwen targets: the target's own. MLA targets have no plain head shape to copy: transformers
    reports head_dim = qk_rope_head_dim (64) with 128 query and 128 KV heads, a 128 x 64 drafter
    whose KV cache per token is 8x that of SpecForge's 56 x 128 with 8 KV heads and whose 128 heads
    run at half the head width FlashInfer/FA3 are tuned for. So an MLA target gets hidden / 128
    heads of 128 (56 for DeepSeek-V3 and Kimi-K2) and 8 KV heads: SpecForge's shape, so drafters and
    configs are interchangeable with its DeepSeek-V3 recipe."""
    hidden, heads = int(target_config.hidden_size), int(target_config.num_attention_heads)
    if getattr(target_config, "kv_lora_rank", None) and hidden % MLA_HEAD_DIM == 0:
        mla_heads = hidden // MLA_HEAD_DIM
        return mla_heads, MLA_KV_HEADS if mla_heads % MLA_KV_HEADS == 0 else mla_heads, MLA_HEAD_DIM
    kv = getattr(target_config, "num_key_value_heads", None) or heads
    return heads, int(kv), int(getattr(target_config, "head_dim", None) or hidden // heads)


def sized_like(target_config) -> dict:
    """The fields every drafter config takes from its target: layer sizes, vocab, norm eps, RoPE."""
    heads, kv_heads, head_dim = attention_shape(target_config)
    return dict(
        hidden_size=target_config.hidden_size,
        intermediate_size=target_config.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=target_config.vocab_size,
        target_hidden_size=target_config.hidden_size,
        target_num_layers=target_config.num_hidden_layers,
        rms_norm_eps=float(getattr(target_config, "rms_norm_eps", 1e-6)),
        max_position_embeddings=int(getattr(target_config, "max_position_embeddings", 4096)),
        rope=target_rope(target_config),
    )


def target_rope(target_config) -> dict:
    """The target's rotary parameters (transformers 5 `rope_parameters`, or legacy theta/scaling)."""
    params = getattr(target_config, "rope_parameters", None)
    if params:
        return dict(params)
    rope = dict(getattr(target_config, "rope_scaling", None) or {"rope_type": "default"})
    rope["rope_theta"] = float(getattr(target_config, "rope_theta", 10000.0))
    return rope

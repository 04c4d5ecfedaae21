"""The target's hidden states for the drafter: which aux layers, and a forward pass that captures them
(TargetHiddenStates: the online extractor, and what offline extraction runs)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Protocol

import torch

from ops.errors import UserError


def _spaced(lo: int, hi: int, k: int) -> list[int]:
    if k <= 1 or hi <= lo:
        return [lo]
    return sorted({round(lo + (hi - lo) * j / (k - 1)) for j in range(k)})


def default_aux_layers(num_layers: int, mode: str = "eagle3", num_dflash_layers: int = 5) -> list[int]:
    """The aux layers captured by default for a target with `num_layers` decoder layers."""
    L = num_layers
    if mode == "dflash":
        if num_dflash_layers == 1:
            return [max(0, min(L // 2, L - 2))]  # SpecForge's choice for one layer: the middle
        return _spaced(1, L - 3, num_dflash_layers) if L >= 4 else _spaced(0, L - 2, num_dflash_layers)
    layers = [1, L // 2 - 1, L - 4]
    if len(set(layers)) == 3 and all(0 <= i < L - 1 for i in layers):
        return layers
    if L < 4:
        return _spaced(0, L - 1, 3)
    return _spaced(0, L - 2, 3)


def check_aux_layers(layers, num_layers: int, log=None) -> list[int]:
    """Valid aux layers in ascending order (the order servers capture them in).

    Layer L-1's output is the last hidden state itself: servers capture the input of layer
    id + 1, so ids must be at most L-2. Unsorted ids are sorted with a notice on stderr."""
    layers = [int(i) for i in layers]
    bad = [i for i in layers if not 0 <= i < num_layers - 1]
    if bad or not layers:
        raise UserError(f"aux layers {layers}: {bad or 'none'} out of range; a target with {num_layers} layers "
                        f"takes ids 0..{num_layers - 2} (the output of layer {num_layers - 1} is the final state)")
    if len(set(layers)) != len(layers):
        raise UserError(f"aux layers {layers} repeat a layer")
    if layers != sorted(layers):
        (log or (lambda m: print(m, file=sys.stderr)))(
            f"aux layers {layers} sorted to {sorted(layers)} (servers capture them in ascending order)")
    return sorted(layers)


def decoder_layers(model):
    """(decoder, its layer list) of any causal LM transformers builds.

    The decoder is `get_decoder()` (the base model whose output is the final-norm hidden state);
    its layers are the module list of `num_hidden_layers` blocks (`.layers` for Llama, Qwen3,
    Qwen3-MoE, DeepSeek-V3, ...; `.h`, `.blocks` or any other name for other families)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    want = int(getattr(config, "num_hidden_layers", -1))
    layers = getattr(base, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) != want:
        lists = [m for _, m in base.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == want]
        layers = lists[0] if lists else None
    if layers is None:
        raise UserError(f"{type(model).__name__}: cannot find its {want} decoder layers "
                        f"(no module list of that length under {type(base).__name__})")
    return base, layers


class HiddenStateTarget(Protocol):
    """What extraction runs: TargetHiddenStates, or trainer.capture_sglang's SGLang one."""

    @property
    def device(self) -> torch.device: ...

    def __call__(self, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        ...


class TargetHiddenStates:
    """Run the target and return (aux [B,T,len*H], last [B,T,H], logits [B,T,V] or None), no grad.

    `model` is a directory or a loaded causal LM. Aux layers are captured with forward hooks on
    the decoder layers (only during the call); `last` is the final-norm output fed to lm_head.
    `device_map` (a directory only, e.g. "auto") spreads a target larger than one GPU over the
    visible GPUs; the outputs are then on the first device of the map (the input embedding's),
    where the drafter is.
    """

    def __init__(self, model, aux_layers=None, *, mode: str = "eagle3", num_dflash_layers: int = 5,
                 dtype=None, device=None, device_map=None, trust_remote_code: bool = False,
                 return_logits: bool = False):
        if isinstance(model, (str, Path)):
            from transformers import AutoModelForCausalLM  # lazy: transformers: 1.4 s to import

            if device_map is None and device is not None:
                device_map = {"": str(device)}  # load straight onto the device (no full copy in host RAM first)
            model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype or torch.float32,
                                                         device_map=device_map, trust_remote_code=trust_remote_code)
        else:
            if dtype is not None:
                model = model.to(dtype)
            if device is not None and device_map is None:
                model = model.to(device)
        self.model = model.eval().requires_grad_(False)
        self.base, self.layers = decoder_layers(self.model)
        self.num_layers = len(self.layers)
        self.hidden_size = int(self.model.config.get_text_config().hidden_size)
        self.aux_layers = check_aux_layers(
            aux_layers if aux_layers is not None else default_aux_layers(self.num_layers, mode, num_dflash_layers),
            self.num_layers,
        )
        self.return_logits = return_logits

    @property
    def device(self) -> torch.device:
        """Where inputs go: the input embedding's device (the first GPU under a device map)."""
        return self.model.get_input_embeddings().weight.device

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 return_logits: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        captured: dict[int, torch.Tensor] = {}

        def hook_for(i):
            def hook(_module, _args, output):
                captured[i] = output[0] if isinstance(output, (tuple, list)) else output
            return hook

        handles = [self.layers[i].register_forward_hook(hook_for(i)) for i in self.aux_layers]
        try:
            with torch.no_grad():
                out = self.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
                home = self.device  # under a device map the layers sit on several GPUs: gather on the first
                last = out.last_hidden_state
                aux = torch.cat([captured[i].to(home) for i in self.aux_layers], dim=-1)
                want_logits = self.return_logits if return_logits is None else return_logits
                head = self.model.get_output_embeddings()
                logits = head(last.to(head.weight.device)).to(home) if want_logits else None
                last = last.to(home)
        finally:
            for h in handles:
                h.remove()
        return aux, last, logits

"""`nodedeck-train hidden-states --backend sglang`: the target runs in SGLang's own model runner.

For the largest targets (MoE/MLA models such as DeepSeek-V3 or Kimi-K2.5 over all GPUs of a node)
a transformers forward is slow or does not fit; SGLang serves them with its own kernels and tensor
parallelism. This backend captures hidden states the way SpecForge's offline preparation does,
through SpecForge's SGLang capture backend (`specforge.offline_capture`): one extend (prefill)
forward per batch with `CaptureHiddenMode.FULL`, the aux layers set with SGLang's
`set_eagle3_layers_to_capture` / `set_dflash_layers_to_capture` (ids in nodedeck's numbering, handed
to SGLang through `trainer.sglang_rules.sglang_layer_ids`, whose rule depends on the architecture).

The node stack: SpecForge 0.2.0's SGLang boundary is written against one SGLang release and its
wheel requires exactly sglang==0.5.14, torch==2.11.0 and transformers==5.8.1 (`NODE_STACK`; the
`node` extra of pyproject.toml pins the same, and a test holds the two together). Install with
`pip install 'nodedeck[trainer,node]'` on the node. `require()` refuses in one line, before any
process group or model exists, when other versions are installed or the boundary does not import.

Launch: `torchrun --standalone --nproc-per-node G --no-python nodedeck-train hidden-states --backend
sglang ...` runs SGLang with tensor parallelism G (every rank computes the same batches; rank 0
writes the shards); G must divide the target's attention heads (refused otherwise). A plain process
is tensor parallelism 1 on one GPU. SGLang's memory settings (`ServerArgs`: mem_fraction_static,
max_running_requests, max_total_tokens, context_length) are passed explicitly: the KV pool holds one
batch of at most `--batch-tokens` padded tokens, so an extend never runs out of memory mid-run.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
from dataclasses import dataclass

import torch

from ops.errors import UserError
from trainer.sglang_rules import sglang_layer_ids

# What SpecForge 0.2.0's wheel requires (its METADATA); the `node` extra pins exactly these.
NODE_STACK = {"sglang": "0.5.14", "specforge": "0.2.0", "torch": "2.11.0", "transformers": "5.8.1"}
# The two whose versions the capture code depends on (torch and transformers follow from pip's resolution).
CAPTURE_PINS = ("sglang", "specforge")
INSTALL_HINT = "pip install 'nodedeck[trainer,node]'"
SGLANG_BATCH_TOKENS = 32768  # default cap of a capture batch's padded tokens (batch x width)


@dataclass(frozen=True)
class MemorySettings:
    """SGLang's memory settings for the capture (ServerArgs fields; None leaves SGLang's default)."""

    mem_fraction_static: float | None = 0.85
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    context_length: int | None = None

    def server_args(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def check_tensor_parallel(config, tp: int) -> None:
    """Refuse in one line a tensor-parallel size SGLang cannot shard the target's attention over."""
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    if heads % tp or (kv % tp and tp % kv):
        fits = [d for d in range(1, 9) if heads % d == 0 and (kv % d == 0 or d % kv == 0)]
        raise UserError(f"--backend sglang: tensor parallel {tp} (the torchrun ranks) does not divide the target's "
                        f"{heads} attention heads / {kv} KV heads; run {', '.join(map(str, fits))} ranks "
                        "(CUDA_VISIBLE_DEVICES and --nproc-per-node)")


def preflight(config, architectures, aux_layers, *, mode: str, tp: int) -> list[int]:
    """Every check that needs no GPU, before anything starts; returns the layer ids to hand SGLang."""
    check_tensor_parallel(config, tp)
    return sglang_layer_ids(architectures, aux_layers, mode)


def _load_capture(model_dir: str, **kwargs):
    """SpecForge's SGLang capture for a model (a separate function so tests can stand in an engine)."""
    from specforge.offline_capture.sglang import load_offline_capture  # lazy: SpecForge is the node extra

    return load_offline_capture(model_dir, **kwargs)


def _init_tensor_parallel(tp_size: int) -> None:
    from specforge.distributed import init_distributed  # lazy: SpecForge is the node extra

    init_distributed(tp_size=tp_size)


class SGLangTargetHiddenStates:
    """Same call as `TargetHiddenStates`: (aux [B,T,len*H], last [B,T,H], None) for padded rows.

    Rows are right-padded; attention is causal, so the first n positions of a row of length n are
    those of the unpadded row. `sglang_ids` are the layer ids as SGLang's model class takes them."""

    def __init__(self, model_dir, aux_layers, *, mode: str, dtype: torch.dtype, sglang_ids=None,
                 memory: MemorySettings = MemorySettings(), trust_remote_code: bool = False):
        require()
        for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                           ("MASTER_PORT", str(_free_port()))):
            os.environ.setdefault(key, value)  # a plain process: a group of one
        _init_tensor_parallel(int(os.environ["WORLD_SIZE"]))
        self.capture = _load_capture(str(model_dir), torch_dtype=dtype, trust_remote_code=trust_remote_code,
                                     **memory.server_args())
        self.capture.set_capture_layers(list(aux_layers if sglang_ids is None else sglang_ids),
                                        capture_method="eagle3" if mode == "eagle3" else "dflash")
        self.aux_layers = list(aux_layers)
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 return_logits: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, None]:
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        out = self.capture.capture(input_ids=input_ids, attention_mask=mask, loss_mask=mask)
        return out.hidden_states, out.last_hidden_states, None


def require() -> None:
    """Refuse in one line, before any work, where this backend cannot run: other versions of the node
    stack than SpecForge's boundary is written for, a boundary that does not import, no CUDA GPU."""
    wrong = []
    for name in CAPTURE_PINS:
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have != NODE_STACK[name]:
            wrong.append(f"{name}=={NODE_STACK[name]} (found {have or 'none'})")
    if wrong:
        raise UserError(f"--backend sglang needs {', '.join(wrong)} on this node: SpecForge's SGLang boundary is "
                        f"written for exactly that stack; install it ({INSTALL_HINT}) or use the transformers backend")
    try:  # the boundary itself, now, not after the process group is up
        import specforge.offline_capture.sglang_backend.capture  # lazy: the node extra  # noqa: F401
        import specforge.offline_capture.sglang_backend.model_runner  # lazy: the node extra  # noqa: F401
    except ImportError as exc:
        raise UserError(f"--backend sglang needs SpecForge's SGLang boundary, which does not import here "
                        f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); reinstall the node "
                        f"stack ({INSTALL_HINT}) or use the transformers backend") from None
    if not torch.cuda.is_available():
        raise UserError("--backend sglang needs a CUDA GPU")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

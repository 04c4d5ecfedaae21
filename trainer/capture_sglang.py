"""`nodedeck-train hidden-states --backend sglang`: the target runs in SGLang's own model runner.

For the largest targets (MoE/MLA models such as DeepSeek-V3 or Kimi-K2.5 over all GPUs of a node)
a transformers forward is slow or does not fit; SGLang serves them with its own kernels and tensor
parallelism. This backend captures hidden states the way SpecForge's offline preparation does,
through SpecForge's SGLang capture backend (`specforge.offline_capture`): one extend (prefill)
forward per batch with `CaptureHiddenMode.FULL`, the aux layers set with SGLang's
`set_eagle3_layers_to_capture` / `set_dflash_layers_to_capture` (ids in nodedeck's numbering: the
output of layer i, which SGLang captures as the input of layer i + 1).

Launch: `torchrun --standalone --nproc-per-node G nodedeck-train hidden-states --backend sglang ...`
runs SGLang with tensor parallelism G (every rank computes the same batches; rank 0 writes the
shards); a plain process is tensor parallelism 1 on one GPU. It needs `sglang` and `specforge` on
the node (`pip install sglang` and `pip install --no-deps specforge==0.2.0`) and a CUDA GPU.
"""

from __future__ import annotations

import os

import torch

from ops.errors import UserError


class SGLangTargetHiddenStates:
    """Same call as `TargetHiddenStates`: (aux [B,T,len*H], last [B,T,H], None) for padded rows.

    Rows are right-padded; attention is causal, so the first n positions of a row of length n are
    those of the unpadded row."""

    def __init__(self, model_dir, aux_layers, *, mode: str, dtype: torch.dtype, trust_remote_code: bool = False):
        require()
        from specforge.distributed import init_distributed
        from specforge.offline_capture.sglang import load_offline_capture

        for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                           ("MASTER_PORT", str(_free_port()))):
            os.environ.setdefault(key, value)  # a plain process: a group of one
        init_distributed(tp_size=int(os.environ["WORLD_SIZE"]))
        self.capture = load_offline_capture(str(model_dir), torch_dtype=dtype, trust_remote_code=trust_remote_code)
        self.capture.set_capture_layers(list(aux_layers), capture_method="eagle3" if mode == "eagle3" else "dflash")
        self.aux_layers = list(aux_layers)
        self.device = torch.device("cuda", torch.cuda.current_device())

    def __call__(self, input_ids, attention_mask=None, *, return_logits=None):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        out = self.capture.capture(input_ids=input_ids, attention_mask=mask, loss_mask=mask)
        return out.hidden_states, out.last_hidden_states, None


def require() -> None:
    """Refuse in one line, before any work, where this backend cannot run."""
    try:
        import sglang  # noqa: F401
        import specforge.offline_capture.sglang  # noqa: F401
    except ImportError as exc:
        raise UserError(f"--backend sglang needs sglang and specforge on this node ({exc}); install them "
                        "(pip install sglang; pip install --no-deps specforge==0.2.0) or use the transformers "
                        "backend") from None
    if not torch.cuda.is_available():
        raise UserError("--backend sglang needs a CUDA GPU")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

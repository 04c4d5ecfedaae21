"""torchrun integration: process group from the environment, DDP or FSDP wrapping, full state dicts.

Launch N processes per node with `torchrun --nproc-per-node N [--nnodes M --node-rank R
--rdzv-endpoint HOST:PORT] -m trainer.train ...`; a plain `python -m trainer.train` is one process.
NCCL on CUDA, gloo on CPU. Every rank builds the same model from the same seed; DDP broadcasts
rank 0's parameters and averages gradients; `--fsdp` shards parameters, gradients and optimiser
state over the ranks (FSDP2 `fully_shard` per decoder layer, then the root).

Nodes need not share a disk: what is read from or written to OUT (checkpoints, results) is read
and written by global rank 0 only, and what other ranks need of it reaches them over the process
group (`from_main`, `load_full_state(from_rank0=True)`, `all_gather_objects`).
"""

from __future__ import annotations

import faulthandler
import gc
import hashlib
import os
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Iterator, TypeVar, cast

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ops.errors import UserError
from trainer.rank_exit import mark_joined

T = TypeVar("T")


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str | None = None, timeout_s: float = 1800.0) -> DistInfo:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK), if any; a collective
    that waits longer than timeout_s (a dead peer) raises instead of hanging."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local if dev.index is None else dev.index)
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s),
                                device_id=dev if dev.type == "cuda" else None)
        mark_joined()
        if not faulthandler.is_enabled():   # a rank that dies of a signal (an abort in C++) says where it was
            faulthandler.enable(all_threads=True)
    return DistInfo(rank, world, local, dev)


def wrap_model(model: torch.nn.Module, info: DistInfo, *, fsdp: bool = False) -> torch.nn.Module:
    """DDP (or FSDP2 with `fsdp`) around the model when there is more than one process."""
    if not info.enabled:
        return model
    if fsdp:
        from torch.distributed.fsdp import fully_shard  # lazy: 0.8 s to import, only to shard

        for layer in _decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        return model

    return DistributedDataParallel(model, device_ids=[info.device.index] if info.device.type == "cuda" else None)


def _decoder_layers(model):
    if hasattr(model, "midlayer"):
        return [model.midlayer]
    return list(getattr(model, "layers", []))


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum a tensor over ranks (returned on CPU; a no-op with one process)."""
    if not info.enabled:
        return t
    backend_dev = info.device if dist.get_backend() == "nccl" else torch.device("cpu")
    x = t.to(backend_dev).clone()
    dist.all_reduce(x)
    return x.cpu()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def all_gather_objects(obj: T, info: DistInfo) -> list[T]:
    """obj from every rank, in rank order, on every rank (small picklable objects: RNG states, digests)."""
    if not info.enabled:
        return [obj]
    out: list = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def from_main(fn: Callable[[], T], info: DistInfo) -> T:
    """fn() run on rank 0 only, its result sent to every rank. A UserError it raises is raised on every
    rank, so no rank goes on to wait for a peer that gave up (other nodes may not see rank 0's disk)."""
    result: T | None = None
    error: str | None = None
    if info.is_main:
        try:
            result = fn()
        except UserError as e:
            error = str(e)
    if info.enabled:
        box: list[object] = [result, error]
        dist.broadcast_object_list(box, src=0)   # unpickled on the other ranks: what rank 0 put in
        result, error = cast("T | None", box[0]), cast("str | None", box[1])
    if error is not None:
        raise UserError(error)
    return cast(T, result)   # set on rank 0, sent to the others


def weights_sha256(module: torch.nn.Module) -> str:
    """sha256 of a module's parameters (names, dtypes, shapes and bytes, in name order)."""
    h = hashlib.sha256()
    for name, p in sorted(module.named_parameters()):
        t = p.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name} {t.dtype} {tuple(p.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded CPU state dict (every rank must call; with FSDP only rank 0 gets the tensors)."""
    from torch.distributed.checkpoint.state_dict import (  # lazy: 1.4 s to import, only for FSDP
        StateDictOptions,
        get_model_state_dict,
    )

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return cast("dict[str, torch.Tensor]", state)   # a model's state (not an optimizer's): tensors only


def full_optimizer_state(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import (  # lazy: 1.4 s to import, only for FSDP
        StateDictOptions,
        get_optimizer_state_dict,
    )

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(model, optimizer, model_state: dict, optim_state: dict | None, *, from_rank0: bool = False) -> None:
    """Load full (unsharded) states saved by `full_model_state` / `full_optimizer_state`.

    from_rank0: only rank 0 holds the states (the others pass empty dicts) and sends them tensor by tensor."""
    from torch.distributed.checkpoint.state_dict import (  # lazy: 1.4 s to import, only for FSDP
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, strict=False, broadcast_from_rank0=from_rank0)
    set_model_state_dict(model, model_state, options=opts)
    if optim_state is not None:
        set_optimizer_state_dict(model, optimizer, optim_state, options=opts)


@contextmanager
def process_group(device: str | None = None, timeout_s: float = 1800.0) -> Iterator[DistInfo]:
    """`init_distributed` for the block, and the process group destroyed on the way out, however the
    block ends.

    The group is destroyed only once nothing but torch.distributed holds it. A DDP reducer that outlives
    `destroy_process_group` frees the gloo group itself later, joining the group's worker threads
    while holding the GIL; a worker still freeing the tensors of its last collective waits for the
    GIL, so the rank hangs there, or aborts ("terminate called without an active exception") when
    that happens at interpreter exit. So the locals of the frames an escaping exception carries (the
    DDP model among them) are cleared, and the cycles collected, before the group goes."""
    info = init_distributed(device, timeout_s)
    try:
        yield info
    except BaseException as exc:
        traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        if info.enabled and dist.is_initialized():
            gc.collect()
            dist.destroy_process_group()

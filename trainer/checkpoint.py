"""Training checkpoints with full resume.

Layout under OUT/checkpoints/:
    step-00000120/state.pt       trainable weights, optimiser, scheduler, sampler {epoch, position},
                                 step, training args, mode and model config (torch.save)
    step-00000120/rng-rank0.pt   RNG states of python, numpy, torch (CPU, CUDA) and the trainer's
                                 own generators, one file per rank
    step-00000120/meta.json      step, epoch, position, time (for people and the dashboard)
    latest                       the name of the newest complete checkpoint
A checkpoint is written to `step-N.tmp` and renamed once complete, so a crash mid-save never
leaves a half checkpoint behind `latest`. Only the newest `keep` are kept. Frozen target weights
(embedding, DFlash lm_head) are not stored; they come from the target.

Only global rank 0 reads and writes checkpoints (the other ranks' RNG states are gathered to it),
so the nodes of a multi-node run need not share a disk: the whole checkpoint is in rank 0's OUT,
and on resume rank 0 reads it and sends every rank its part (`load_for_resume`).
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from ops.errors import NodedeckError, UserError
from trainer.distributed import (
    DistInfo,
    all_gather_objects,
    barrier,
    from_main,
    full_model_state,
    full_optimizer_state,
)
from trainer.jsonl import write_json
from trainer.models.dflash import DFlashConfig, DFlashDrafter
from trainer.models.eagle3 import Eagle3Config, Eagle3Drafter
from trainer.models.target import load_embed_and_head


def checkpoint_root(out_dir) -> Path:
    return Path(out_dir) / "checkpoints"


def rng_state(generators: dict[str, torch.Generator]) -> dict:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generators": {name: g.get_state() for name, g in generators.items()},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict, generators: dict[str, torch.Generator]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        # one state per GPU visible when saved; a resume may see fewer (another CUDA_VISIBLE_DEVICES)
        for index, cuda_state in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, index)
    for name, g in generators.items():
        if name in state["generators"]:
            g.set_state(state["generators"][name])


def save_checkpoint(out_dir, step: int, *, model, optimizer, scheduler, sampler, info: DistInfo, payload: dict,
                    generators: dict[str, torch.Generator], frozen=(), keep: int = 3) -> Path:
    """Write checkpoint `step` into rank 0's OUT (every rank calls this); returns its directory."""
    root = checkpoint_root(out_dir)
    name = f"step-{step:08d}"
    tmp, final = root / f"{name}.tmp", root / name
    model_state = {k: v for k, v in full_model_state(model).items() if k not in frozen}
    bad = [name for rank_bad in all_gather_objects(nonfinite_tensors(model_state), info) for name in rank_bad]
    if bad:  # every rank sees the same list: all stop together, and nothing is written
        raise NonFiniteWeights(f"step {step}: non-finite values in {', '.join(sorted(set(bad))[:4])}"
                               f"{' ...' if len(set(bad)) > 4 else ''}; checkpoint not saved")
    optim_state = full_optimizer_state(model, optimizer)
    rngs = all_gather_objects(rng_state(generators), info)
    if info.is_main:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        for rank, rng in enumerate(rngs):
            torch.save(rng, tmp / f"rng-rank{rank}.pt")
        torch.save({"model": model_state, "optimizer": optim_state, "scheduler": scheduler.state_dict(),
                    "sampler": sampler.state(), "step": step, **payload}, tmp / "state.pt")
        write_json(tmp / "meta.json", {"step": step, **sampler.state(), "time": round(time.time(), 3)})
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        (root / "latest.tmp").write_text(name + "\n")
        (root / "latest.tmp").replace(root / "latest")
        done = sorted(p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))
        for old in done[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    barrier(info)   # no rank goes on (or exits) before the checkpoint is complete
    return final


class NonFiniteWeights(NodedeckError):
    """The weights hold NaN or inf: they are never saved or exported."""


def nonfinite_tensors(state: dict) -> list[str]:
    """Names of the floating-point tensors of a state dict that hold NaN or inf."""
    return [k for k, v in state.items()
            if isinstance(v, torch.Tensor) and v.is_floating_point() and not bool(torch.isfinite(v).all())]


def resolve_checkpoint(path) -> Path:
    """A checkpoint directory, or the latest one under a training OUT dir."""
    path = Path(path)
    if (path / "state.pt").exists():
        return path
    root = checkpoint_root(path) if (checkpoint_root(path) / "latest").exists() else path
    latest = root / "latest"
    if not latest.exists():
        raise UserError(f"{path}: no checkpoint here (no state.pt and no checkpoints/latest)")
    found = root / latest.read_text().strip()
    if not (found / "state.pt").exists():
        raise UserError(f"{latest}: names {found.name}, which has no state.pt")
    return found


def load_checkpoint(path) -> dict:
    """The state of a checkpoint directory (or of the latest one under an OUT dir), with its `path`."""
    path = resolve_checkpoint(path)
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    state["path"] = str(path)
    return state


def load_for_resume(out_dir, info: DistInfo) -> tuple[dict, dict | None]:
    """(state, this rank's RNG state or None) of the latest checkpoint in rank 0's OUT, read by rank 0 alone.

    Rank 0 gets the whole state; every other rank gets it with empty `model` and `optimizer` (rank 0
    sends those: `load_full_state(..., from_rank0=True)`) and its own RNG state. A missing or bad
    checkpoint is a UserError on every rank."""
    full: dict = {}

    def read() -> tuple[dict, list]:
        state = load_checkpoint(out_dir)
        path = Path(state["path"])
        full.update(state)
        rngs = [torch.load(f, map_location="cpu", weights_only=False) if f.exists() else None
                for f in (path / f"rng-rank{r}.pt" for r in range(int(state.get("world_size", 1))))]
        return {k: v for k, v in state.items() if k not in ("model", "optimizer")}, rngs

    header, rngs = from_main(read, info)
    state = full if info.is_main else {**header, "model": {}, "optimizer": {}}
    return state, rngs[info.rank] if info.rank < len(rngs) else None


def drafter_from_checkpoint(path):
    """(drafter module with trained weights, export summary) from a checkpoint or OUT dir."""
    state = load_checkpoint(path)
    args = state["args"]
    embed, head = load_embed_and_head(args["target"])
    weights = dict(state["model"])
    model: Eagle3Drafter | DFlashDrafter
    if state["mode"] == "eagle3":
        model = Eagle3Drafter(Eagle3Config.from_dict(state["model_config"]), weights["d2t"], weights["t2d"])
        weights["embed_tokens.weight"] = embed
    else:
        model = DFlashDrafter(DFlashConfig.from_dict(state["model_config"]))
        weights["embed_tokens.weight"], weights["lm_head.weight"] = embed, head
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in weights.items()}, strict=True)
    return model, export_summary(state)


def export_summary(state: dict) -> dict:
    return {"mode": state["mode"], "trained_steps": state["step"], "target": state["args"]["target"],
            "epoch": state["sampler"]["epoch"]}

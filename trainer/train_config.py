"""`TrainConfig`: every setting of one training run, validated and resolved once from the arguments.

Built by `TrainConfig.from_args` from the parsed command line; frozen afterwards. Defaults that depend
on other settings (the mode's learning rate and warmup, gamma from the block size, the batch size, the
reader processes) are resolved here, so the trainer never sees a None it must interpret. Bad values raise
`UserError` with a one-line message (never `assert`, which `python -O` strips).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from ops.errors import UserError
from trainer.losses import gamma_for_block
from trainer.objectives import OBJECTIVES

# Settings that must not change when resuming (they define the model or the data order).
RESUME_FIXED = ("mode", "target", "vocab", "hidden_states", "data", "online", "seed", "batch_size", "batch_tokens",
                "num_buckets", "max_length", "max_samples", "ttt_length", "block_size", "draft_layers", "aux_layers")


@dataclass(frozen=True)
class TrainConfig:
    # what to train, on what
    mode: str                       # eagle3 | dflash (selects the objective, trainer.objectives)
    target: str                     # target model directory
    vocab: str | None               # eagle3: draft vocabulary (d2t/t2d)
    hidden_states: str | None       # offline: hidden-state shards
    online: bool                    # run the target on each batch instead
    data: str | None                # online: tokenized JSONL
    aux_layers: tuple[int, ...] | None  # online: target layers to read (None: the mode's default)
    out: str
    # data and batching
    epochs: int
    max_steps: int | None           # also sizes the LR schedule
    batch_size: int | None          # sequences per batch per rank (exclusive with batch_tokens)
    batch_tokens: int | None        # token budget per batch per rank
    max_length: int
    num_buckets: int
    num_workers: int                # processes reading batches ahead
    max_samples: int | None
    seed: int
    # optimiser and schedule
    lr: float                       # peak learning rate
    warmup_ratio: float             # warmup share of all steps
    min_lr_ratio: float             # cosine floor as a fraction of the peak
    weight_decay: float
    betas: tuple[float, float]
    max_grad_norm: float            # clipping (0: off)
    max_nonfinite_steps: int        # skipped non-finite steps in a row before stopping
    # EAGLE-3
    ttt_length: int
    ttt_decay: float
    # DFlash
    block_size: int
    gamma: float
    num_anchors: int
    draft_layers: int
    mask_token_id: int | None
    noise_start: float
    noise_end: float
    noise_warmup_steps: int
    # logging, checkpoints, export
    log_every: int
    metrics: str | None
    progress: str | None            # progress JSONL (default $NODEDECK_PROGRESS), see trainer.progress
    save_every: int
    keep_checkpoints: int
    resume: bool
    export_dtype: str
    wandb_project: str | None
    tensorboard_dir: str | None
    # devices and processes
    device: str | None
    dtype: str | None
    trust_remote_code: bool
    device_map: str | None
    fsdp: bool
    dist_timeout: float

    @classmethod
    def from_args(cls, args) -> TrainConfig:
        """Validate parsed arguments (argparse.Namespace, not modified) and resolve their defaults."""
        a = vars(args)
        if a["online"] and not a["data"]:
            raise UserError("--online needs --data tokenized.jsonl")
        if a["data"] and not a["online"]:
            raise UserError("--data is for --online; offline training reads --hidden-states")
        if a["device_map"] and not a["online"]:
            raise UserError("--device-map spreads the target over the GPUs: it is for --online (offline training "
                            "reads hidden states and loads no target)")
        if a["device_map"] and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise UserError("--device-map spreads one copy of the target over the GPUs; under torchrun every rank "
                            "loads its own copy: use one of them")
        objective = OBJECTIVES.get(a["mode"])
        if objective is None:
            raise UserError(f"--mode {a['mode']!r}: choose one of {', '.join(OBJECTIVES)}")
        if a["mode"] == "eagle3" and not a["vocab"]:
            raise UserError("--mode eagle3 needs --vocab draft_vocab.safetensors (nodedeck-train vocab)")
        for name in ("epochs", "log_every", "ttt_length", "block_size", "draft_layers", "max_length", "num_anchors",
                     "max_nonfinite_steps"):
            if a[name] < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1")
        if a["max_steps"] is not None and a["max_steps"] < 1:
            raise UserError("--max-steps must be at least 1")
        if a["mode"] == "dflash" and a["block_size"] < 2:
            raise UserError("--block-size must be at least 2")
        gamma = gamma_for_block(a["block_size"]) if a["gamma"] is None else a["gamma"]
        if gamma <= 0:
            raise UserError("--gamma must be positive")
        num_workers = (0 if a["online"] else 2) if a["num_workers"] is None else a["num_workers"]
        if num_workers < 0:
            raise UserError("--num-workers must be at least 0")
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in a.items() if k in fields},
                      "gamma": gamma,
                      "batch_size": 1 if a["batch_size"] is None and a["batch_tokens"] is None else a["batch_size"],
                      "num_workers": num_workers,
                      "lr": objective.lr if a["lr"] is None else a["lr"],
                      "warmup_ratio": objective.warmup_ratio if a["warmup_ratio"] is None else a["warmup_ratio"],
                      "betas": _betas(a["betas"]),
                      "noise_end": a["noise_start"] if a["noise_end"] is None else a["noise_end"],
                      "aux_layers": _layers(a["aux_layers"]),
                      "progress": a.get("progress")})

    def to_dict(self) -> dict:
        """Plain JSON-able values (lists for tuples), as run.json and checkpoints store them."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def _betas(text) -> tuple[float, float]:
    if isinstance(text, (list, tuple)):
        text = ",".join(str(x) for x in text)
    try:
        betas = tuple(float(x) for x in str(text).split(","))
    except ValueError:
        betas = ()
    if len(betas) != 2:
        raise UserError(f"--betas {text!r}: expected two numbers like 0.9,0.95")
    return betas


def _layers(text) -> tuple[int, ...] | None:
    if text is None or isinstance(text, (list, tuple)):
        return None if text is None else tuple(int(x) for x in text)
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"--aux-layers {text!r}: expected comma-separated integers") from None

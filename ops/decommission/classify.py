"""What kind of artifact a node file is: one ordered rule table, first match wins.

Small classes (scripts, logs, configs, progress, notes) are always preserved by
default; large ones (checkpoints, datasets, hidden states, other) are preserved
by default only when they are not already stored in S3. nodedeck's own
environment on the node (`nodedeck_env`: the venv and wheels `node setup` made,
own_env.py) is no rule's match: the inventory puts a file there by where it
lies, and it is left out by default (`node setup` makes it again).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from ops.errors import UserError

SMALL_CLASSES = ("scripts", "logs", "configs", "progress", "notes")
LARGE_CLASSES = ("checkpoints", "datasets", "hidden_states", "other")
ENV_CLASS = "nodedeck_env"
CLASSES = SMALL_CLASSES + LARGE_CLASSES + (ENV_CLASS,)

LARGE_JSON = 16 << 20
"""A .json/.jsonl at least this big is data, whatever its name."""

_WEIGHTS = (".safetensors", ".pt", ".pth", ".ckpt", ".gguf")
_DATA_EXT = (
    ".jsonl", ".json", ".parquet", ".arrow", ".csv", ".tsv", ".npy", ".npz", ".h5", ".hdf5",
    ".tfrecord", ".bin", ".idx", ".zst", ".gz", ".tar", ".pkl", ".feather", ".mds",
)
_CONFIG_NAMES = {
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt",
    "tokenizer.model", "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
    "model.safetensors.index.json", "pytorch_model.bin.index.json", "nodes.toml", "plan.toml",
    "requirements.txt", "pyproject.toml", ".env", "ds_config.json",
}
_CONFIG_EXT = (".toml", ".yaml", ".yml", ".ini", ".cfg", ".conf", ".patch", ".diff", ".jinja")
_SCRIPT_EXT = (".sh", ".bash", ".zsh", ".py", ".slurm", ".sbatch", ".pl", ".rb", ".js", ".ts")
_SCRIPT_NAMES = {"Makefile", "Dockerfile", "Justfile", "Procfile"}
_NOTE_EXT = (".md", ".txt", ".rst", ".ipynb", ".org")
_LOG_EXT = (".log", ".out", ".err")

_PROGRESS_NAME = re.compile(r"(^|[_.-])(progress|metrics|status|state)([_.-][^/]*)?\.jsonl?$", re.I)
_LOG_ROTATED = re.compile(r"\.(log|out|err)\.\d+$", re.I)
_HIDDEN_DIR = re.compile(r"^(hidden[_-]?states?|hiddens?|hs|activations|features)([_-].*)?$", re.I)
_HIDDEN_NAME = re.compile(r"hidden[_-]?states?", re.I)
_CKPT_DIR = re.compile(
    r"^(checkpoints?|ckpts?|global[_-]?step\d*|step[_-]?\d+|epoch[_-]?\d+|iter[_-]?\d+|"
    r"checkpoint[_-]\d+|weights|models?|drafters?|exports?|final|best)([_-].*)?$",
    re.I,
)
_DATA_DIR = re.compile(r"^(data|datasets?|corpus|shards?|regenerated|responses|prepared)([_-].*)?$", re.I)
_LOG_DIR = re.compile(r"^(logs?|runs?)$", re.I)


@dataclass(frozen=True)
class FileFacts:
    """What the rules look at: the relative path and the size."""

    path: str
    size: int

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def dirs(self) -> list[str]:
        return self.path.split("/")[:-1]

    @property
    def ext(self) -> str:
        name = self.name
        dot = name.rfind(".")
        return name[dot:].lower() if dot > 0 else ""

    def under(self, pattern: re.Pattern) -> bool:
        return any(pattern.match(d) for d in self.dirs)


@dataclass(frozen=True)
class Rule:
    cls: str
    why: str
    test: Callable[[FileFacts], bool]


RULES: tuple[Rule, ...] = (
    Rule("progress", "progress/metrics/state JSON or JSONL by name",
         lambda f: bool(_PROGRESS_NAME.search(f.name))),
    Rule("progress", "*.progress marker", lambda f: f.ext == ".progress"),
    Rule("configs", "model/tokenizer/generation config by name", lambda f: f.name in _CONFIG_NAMES),
    Rule("configs", "config or patch by extension (.toml .yaml .ini .patch .diff ...)",
         lambda f: f.ext in _CONFIG_EXT),
    Rule("logs", "log by extension (.log .out .err, rotated .log.N)",
         lambda f: f.ext in _LOG_EXT or bool(_LOG_ROTATED.search(f.name))),
    Rule("logs", "text under a logs/ directory",
         lambda f: f.under(_LOG_DIR) and f.ext in (".txt", "")),
    Rule("scripts", "script by extension or name",
         lambda f: f.ext in _SCRIPT_EXT or f.name in _SCRIPT_NAMES),
    Rule("notes", "notes (.md .txt .rst .ipynb)", lambda f: f.ext in _NOTE_EXT),
    Rule("hidden_states", "under a hidden-states directory or named hidden_states*",
         lambda f: f.under(_HIDDEN_DIR) or bool(_HIDDEN_NAME.search(f.name))),
    Rule("checkpoints", "weights (.safetensors .pt .pth .ckpt .gguf)", lambda f: f.ext in _WEIGHTS),
    Rule("checkpoints", ".bin under a checkpoint-like directory or named *model*.bin",
         lambda f: f.ext == ".bin" and (f.under(_CKPT_DIR) or "model" in f.name.lower())),
    Rule("datasets", "data file by extension (.jsonl .parquet .arrow .npy ...)",
         lambda f: f.ext in _DATA_EXT and (f.ext not in (".json", ".jsonl") or f.size >= LARGE_JSON
                                            or f.under(_DATA_DIR))),
    Rule("datasets", "under a data directory", lambda f: f.under(_DATA_DIR)),
    Rule("progress", "small JSONL outside data directories", lambda f: f.ext == ".jsonl"),
    Rule("configs", "small JSON outside data directories", lambda f: f.ext == ".json"),
)


def classify(path: str, size: int) -> str:
    """The class of a file given its path relative to its root and its size."""
    facts = FileFacts(path, size)
    for rule in RULES:
        if rule.test(facts):
            return rule.cls
    return "other"


def is_small(cls: str) -> bool:
    return cls in SMALL_CLASSES


def parse_classes(names: list[str] | None, flag: str) -> set[str]:
    """Validate --include/--exclude values (comma lists allowed)."""
    out: set[str] = set()
    for item in names or []:
        for name in filter(None, (n.strip().replace("-", "_") for n in item.split(","))):
            if name not in CLASSES:
                raise UserError(f"{flag} {name}: unknown class (one of: {', '.join(CLASSES)})")
            out.add(name)
    return out

"""The trainer a node was set up with, recorded in the node's state on this machine.

`nodedeck node setup NODE` stores one TrainerSetup per node in its state file (`state_dir()/nodes/
<node>.sqlite`, or the workspace's state dir): the node's environment, the directory holding its
`nodedeck-train`, and what `nodedeck-train --version` said there. Every stage launched on the node
then gets that directory first on its PATH (`path_line`), so `nodedeck-train` (a plan's `${train}`),
`python` and `torchrun` are the environment's without `--var`.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

from ops.state import StateStore
from ops.state.file import node_state_path

KEY = "setup/trainer"


@dataclass(frozen=True)
class TrainerSetup:
    """What `node setup` installed and checked on one node."""

    python: str                    # the environment's python on the node
    bin_dir: str                   # the directory holding its nodedeck-train
    version: str                   # `nodedeck-train --version` there, as checked at setup
    env: str | None = None         # the venv nodedeck made (None: an existing env, or `local`'s own)
    wheel_sha256: str | None = None
    torch: str | None = None       # the torch version the environment imports, None when it has none
    at: float = 0.0                # unix time of the setup

    @property
    def trainer(self) -> str:
        return f"{self.bin_dir.rstrip('/')}/nodedeck-train"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Any) -> "TrainerSetup | None":
        """The record, or None for anything that is not one (a value written by another version)."""
        if not isinstance(d, dict):
            return None
        names = {f.name for f in fields(cls)}
        kept = {k: v for k, v in d.items() if k in names}
        if not all(isinstance(kept.get(k), str) for k in ("python", "bin_dir", "version")):
            return None
        return cls(**kept)


def save(store: StateStore, setup: TrainerSetup) -> None:
    store.kv_set(KEY, {**setup.to_json(), "at": setup.at or time.time()})


def load(store: StateStore) -> TrainerSetup | None:
    """The node's recorded setup from its open state store, None when it was never set up."""
    return TrainerSetup.from_json(store.kv_get(KEY))


def recorded(node_name: str) -> TrainerSetup | None:
    """The node's recorded setup, read without creating a state file for a node that has none."""
    if not node_state_path(node_name).exists():
        return None
    store = StateStore.for_node(node_name)
    try:
        return load(store)
    finally:
        store.close()


def path_line(setup: TrainerSetup) -> str:
    """The setup line a stage's command runs after: the trainer's directory first on PATH."""
    return f'export PATH={shlex.quote(setup.bin_dir)}:"$PATH"'

"""What a `node setup` reports: one StepResult per step as it ends, and the SetupResult of the whole run."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from ops.setup.record import TrainerSetup


class StepStatus(str, enum.Enum):
    OK = "ok"                # checked, or done now
    SKIPPED = "skipped"      # already done by an earlier setup
    WARNING = "warning"      # worth knowing, the setup goes on
    FAILED = "failed"        # the setup stops here


@dataclass(frozen=True)
class StepResult:
    step: str
    status: StepStatus
    detail: str
    seconds: float

    def to_json(self) -> dict:
        return {"step": self.step, "status": self.status.value, "detail": self.detail,
                "seconds": round(self.seconds, 2)}


@dataclass(frozen=True)
class SetupOptions:
    python: str | None = None          # an existing env's python on the node (installed into, no venv made)
    env: str | None = None             # where the venv goes (default <root>/.nodedeck/venv)
    wheelhouse: Path | None = None     # wheels on this machine to push and install from with --no-index
    torch_index: str | None = None     # a package index to take torch from (a CPU build's, say) when none is there
    with_node_stack: bool = False      # also the `node` extra (sglang)
    min_free_gib: float = 20.0


@dataclass(frozen=True)
class SetupResult:
    node: str
    steps: tuple[StepResult, ...]
    setup: TrainerSetup | None

    @property
    def ok(self) -> bool:
        return self.setup is not None and all(s.status is not StepStatus.FAILED for s in self.steps)

    def to_json(self) -> dict:
        return {"node": self.node, "ok": self.ok, "steps": [s.to_json() for s in self.steps],
                "setup": self.setup.to_json() if self.setup else None}


class Failed(Exception):
    """A step that cannot go on: its one-line reason."""


Outcome = tuple[StepStatus, str]

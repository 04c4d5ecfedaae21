"""Before launch: the nodes a plan runs `nodedeck-train` on that `nodedeck node setup` never set up."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable

from ops import hints
from ops.plan.model import Plan, Stage
from ops.setup.record import TrainerSetup

_TRAINER = re.compile(r"(?<![\w/.~-])nodedeck-train(?![\w.-])")   # the bare command, not /some/bin/nodedeck-train
_VAR = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_.]*)(?::raw)?\}")


def runs_trainer(plan: Plan, stage: Stage) -> bool:
    """The stage's command (or its smoke variant) runs `nodedeck-train` found on the PATH."""
    text = stage.command + " " + (stage.smoke.command if stage.smoke else "")
    for _ in range(8):       # variables holding variables (`train = "${bin}/..."`)
        new = _VAR.sub(lambda m: plan.vars.get(m.group(1), m.group(0)), text)
        if new == text:
            break
        text = new
    return bool(_TRAINER.search(text))


def _beside_this_python() -> bool:
    """`local` runs the nodedeck-train installed with this nodedeck, as the demo records it."""
    return (Path(sys.executable).parent / "nodedeck-train").exists()


def missing_trainers(plan: Plan, default_node: str | None,
                     recorded: Callable[[str], TrainerSetup | None]) -> list[str]:
    """One line per node that runs `nodedeck-train` for the plan and has no recorded setup (`local` needs none
    when this nodedeck's own nodedeck-train is installed beside its Python)."""
    need: dict[str, list[str]] = {}
    for stage in plan.stages:
        if runs_trainer(plan, stage):
            for name in stage.nodes or (stage.node or default_node or plan.node or "local",):
                need.setdefault(name, []).append(stage.id)
    out = []
    for name, stages in need.items():
        if recorded(name) is None and not (name == "local" and _beside_this_python()):
            listed = ", ".join(stages[:3]) + (f" and {len(stages) - 3} more" if len(stages) > 3 else "")
            out.append(f"node {name} has no trainer installed by nodedeck ({listed} run nodedeck-train there): "
                       f"run `{hints.current().command('node', 'setup', name)}`")
    return out

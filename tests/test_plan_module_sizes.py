"""The scheduler stays in parts (issue 32): scheduler.py keeps only the tick loop and the user's actions,
and no module of the plan language (ops/plan) or the run engine (ops/run) grows past what a reader takes in
at once."""

from pathlib import Path

import ops.plan
import ops.run

PLAN_DIR = Path(ops.plan.__file__).parent
RUN_DIR = Path(ops.run.__file__).parent
SCHEDULER_LINES = 500
MODULE_LINES = 400


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_scheduler_keeps_the_tick_loop_and_the_actions_only():
    assert _lines(RUN_DIR / "scheduler.py") <= SCHEDULER_LINES


def test_no_module_of_ops_plan_or_ops_run_exceeds_its_line_budget():
    over = {f"{p.parent.name}/{p.name}": _lines(p) for d in (PLAN_DIR, RUN_DIR) for p in d.glob("*.py")
            if p != RUN_DIR / "scheduler.py" and _lines(p) > MODULE_LINES}
    assert over == {}

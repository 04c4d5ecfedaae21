"""The scheduler stays in parts (issue 32): scheduler.py keeps only the tick loop and the user's actions,
and no module of ops/plan grows past what a reader takes in at once."""

from pathlib import Path

import ops.plan

PLAN_DIR = Path(ops.plan.__file__).parent
SCHEDULER_LINES = 500
MODULE_LINES = 400


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_scheduler_keeps_the_tick_loop_and_the_actions_only():
    assert _lines(PLAN_DIR / "scheduler.py") <= SCHEDULER_LINES


def test_no_module_of_ops_plan_exceeds_its_line_budget():
    over = {p.name: _lines(p) for p in PLAN_DIR.glob("*.py")
            if p.name != "scheduler.py" and _lines(p) > MODULE_LINES}
    assert over == {}

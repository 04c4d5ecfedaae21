"""A training stage's row and the Training panel show one rate and one ETA, from one source (issue 39, item 9:
the row said `2.92 steps/s · ETA 1m32s` while the panel said `1.16 steps/s ETA 3m53s`, and the panel was
right). The row took the last progress record's rate (steps since the record before, a second or so), the
panel its window over the metrics file; now the row of the stage whose metrics the panel reads shows the
panel's figures.

On the loopback sshd as node gpu1, a stage writes what a trainer does: a progress record whose own rate is a
burst (2.92 steps/s) and a metrics file whose steps went at 1.16 steps/s; then it waits.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.support.tmux_sessions import kill_plan_sessions
from tui.live import LiveSource
from tui.widgets.plan import progress_text

WRITER = """
import json, os, sys, time
now = time.time()
with open(sys.argv[1], "w") as f:
    for i, step in enumerate(range(0, 117, 4)):
        f.write(json.dumps({"ts": now - 100 + i * 400 / 116, "step": step, "total_steps": 400, "loss": 5.0}) + "\\n")
with open(os.environ["NODEDECK_PROGRESS"], "a") as f:
    f.write(json.dumps({"ts": now, "done": 116, "total": 400, "unit": "steps", "rate": 2.92}) + "\\n")
time.sleep(300)
"""


@pytest.fixture
def training_stage(tmp_path, sshd):
    name = f"rate{uuid.uuid4().hex[:8]}"
    config = tmp_path / "nodes.toml"
    config.write_text(f'[nodes.gpu1]\nssh = "{sshd.alias}"\nssh_config = "{sshd.ssh_config}"\n'
                      f'root = "{tmp_path / "root"}"\nconnect_timeout = 5\n')
    (tmp_path / "writer.py").write_text(WRITER)
    plan = tmp_path / "plan.toml"
    plan.write_text(f'''[plan]
name = "{name}"
[[stage]]
id = "train"
command = {json.dumps(f"python3 {tmp_path / 'writer.py'} ${{root}}/drafter/metrics.jsonl")}
outputs = ["${{root}}/drafter/metrics.jsonl"]
''')
    yield config, plan
    kill_plan_sessions(name)


def test_the_row_and_the_panel_show_one_rate_and_one_eta(training_stage):
    config, plan = training_stage
    src = LiveSource(config_path=config, node="gpu1", plan_path=plan, timeout=10)
    try:
        assert src.scheduler is not None
        src.scheduler.start("train", smoke=False)
        deadline = time.monotonic() + 60
        while True:
            panel = src.poll_training(200)
            view = src.poll_plan()
            row = view.progress.get("train")
            if panel.snapshot is not None and panel.snapshot.step == 116 and row is not None and row.record:
                break
            assert time.monotonic() < deadline, f"no training figures: {panel.note} / {view.progress}"
            time.sleep(0.3)
        shown_in_row = progress_text(row).plain
        assert "1.16 steps/s · ETA 4m04s" in shown_in_row and "2.92" not in shown_in_row, shown_in_row
        assert "116/400 steps" in shown_in_row
        from tui.widgets.training import stats_text  # the panel's text, built as it draws it

        shown_in_panel = stats_text(panel.snapshot).plain
        assert "1.16 steps/s  ETA 4m04s" in shown_in_panel, shown_in_panel
    finally:
        src.close()

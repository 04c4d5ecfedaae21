"""Every run keeps its metrics: after reruns of a stage, a fresh dashboard overlays the run before the
latest (read from the copy kept on the node), and only the newest few copies stay."""

from __future__ import annotations

import json
import time

from ops.plan.runmetrics import KEEP, archived
from tests.support.local_plan import local_plan
from tests.support.tmux_sessions import kill_plan_sessions
from tui.live import LiveSource

PLAN = r"""
[plan]
name = "NAME"
node = "local"

[[stage]]
id = "train"
title = "Train (each run writes its number as the loss)"
command = '''n=$(( $(cat count 2>/dev/null || echo 0) + 1 )); echo $n > count
mkdir -p out && : > out/metrics.jsonl
for i in 0 1 2 3 4; do printf '{"step": %d, "loss": %d}\n' $i $n >> out/metrics.jsonl; done'''
outputs = ["out/metrics.jsonl"]
verify = [{ kind = "min_lines", path = "out/metrics.jsonl", min = 5 }]
"""


def _run_to_completion(src: LiveSource, restart: bool) -> None:
    sched = src.scheduler
    assert sched is not None
    if restart:
        sched.restart("train")
    end = time.monotonic() + 30
    while time.monotonic() < end:
        sched.tick()
        if sched.view("train").state.value == "completed":
            return
        time.sleep(0.2)
    raise AssertionError(f"train did not complete: {sched.view('train')}")


def test_a_fresh_dashboard_overlays_the_previous_run_of_the_same_stage(tmp_path):
    plan, name = local_plan(tmp_path, PLAN, "rm")
    metrics = tmp_path / "work" / "out" / "metrics.jsonl"
    try:
        src = LiveSource(plan_path=plan, timeout=5, auto=True)
        try:
            for n in range(KEEP + 2):        # runs 1..5: the copies of the runs before the last are kept
                _run_to_completion(src, restart=n > 0)
        finally:
            src.close()
        assert {json.loads(x)["loss"] for x in metrics.read_text().splitlines()} == {KEEP + 2}
        kept = sorted(p.name for p in metrics.parent.glob("metrics.run*.jsonl"))
        assert len(kept) == KEEP, kept

        fresh = LiveSource(plan_path=plan, timeout=5)   # a restart of nodedeck: nothing remembered in memory
        try:
            fresh.poll_plan()
            view = fresh.poll_training(100)
            assert set(view.series["loss"].y) == {KEEP + 2.0}
            assert set(view.previous.y) == {KEEP + 1.0} and len(view.previous) == 5
            assert view.previous_label == "previous full run"
            runs = fresh.scheduler.node(fresh.plan.stage("train")).store.runs_for_stage(
                fresh.scheduler.run_key(fresh.plan.stage("train")))
            assert archived(str(metrics), runs[-2].id).endswith(kept[-1])
        finally:
            fresh.close()
    finally:
        kill_plan_sessions(name)

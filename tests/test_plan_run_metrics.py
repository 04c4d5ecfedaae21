"""Every run keeps its metrics: after reruns of a stage, a fresh dashboard overlays the run before the
latest (read from the copy kept on the node, local or over SSH), and only the newest few copies stay."""

from __future__ import annotations

import json
import time
import uuid

from ops.run.runmetrics import KEEP, archived
from tests.support.local_plan import local_plan
from tests.support.tmux_sessions import kill_plan_sessions
from tests.support.tui_screens import Seen, aio, until
from tui.app import NodedeckApp
from tui.live import LiveSource
from tui.widgets.training import TrainingPanel

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


def _run_to_completion(src: LiveSource, restart: bool, timeout: float = 30) -> None:
    sched = src.scheduler
    assert sched is not None
    if restart:
        sched.restart("train")
    end = time.monotonic() + timeout
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
            assert view.previous_label == f"previous run {KEEP + 1}"
            runs = fresh.scheduler.ctx.handle(fresh.plan.stage("train")).store.runs_for_stage(
                fresh.scheduler.ctx.run_key(fresh.plan.stage("train")))
            assert archived(str(metrics), runs[-2].id).endswith(kept[-1])
        finally:
            fresh.close()
    finally:
        kill_plan_sessions(name)


@aio
async def test_a_restarted_dashboard_on_an_ssh_node_is_sent_the_previous_runs_loss(tmp_path, sshd):
    cfg = tmp_path / "xdg-config" / "nodedeck" / "nodes.toml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    root = tmp_path / "remote-work"
    cfg.write_text(f'[nodes.testnode]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\nroot = "{root}"\n'
                   'connect_timeout = 5\n')
    name = f"rm{uuid.uuid4().hex[:8]}"
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.replace("NAME", name).replace('node = "local"', 'node = "testnode"'))
    try:
        first = LiveSource(plan_path=plan, timeout=10, auto=True)
        try:
            _run_to_completion(first, restart=False, timeout=60)
            _run_to_completion(first, restart=True, timeout=60)   # run 2 rewrites out/metrics.jsonl
        finally:
            first.close()

        src = LiveSource(plan_path=plan, timeout=10)   # nodedeck started again: the overlay comes from the node
        app = NodedeckApp(src, refresh_s=0.2)
        seen = Seen()
        try:
            async with app.run_test(size=(120, 40), message_hook=seen) as pilot:
                def sent():
                    return [view for view in seen.results(TrainingPanel) if len(view.previous)]

                await until(pilot, lambda: sent(), 60, "a training poll carrying the previous run")
                view = sent()[-1]
                assert set(view.series["loss"].y) == {2.0} and set(view.previous.y) == {1.0}
                assert len(view.previous) == 5 and view.previous_label == "previous run 1"
        finally:
            src.close()
    finally:
        kill_plan_sessions(name)

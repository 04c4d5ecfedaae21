"""The dashboard on the local node through LiveSource: training metrics, a followed todo list, the wizard key."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import AsyncIterator

from textual.pilot import Pilot

from tests.support.local_plan import local_plan, write_nodes_toml
from tests.support.tmux_sessions import kill_plan_sessions
from tests.support.tui_screens import aio, until, wait_polled
from tui.app import NodedeckApp
from tui.live import LiveSource
from tui.widgets.charts import LineChart
from tui.widgets.plan import PlanList
from tui.widgets.training import TrainingPanel

PLAN = r"""
[plan]
name = "NAME"
node = "local"

[[stage]]
id = "train"
title = "Train (writes a metrics JSONL)"
command = "true"
verify = [{ kind = "json_field", path = "full/metrics.jsonl", field = "loss", op = "<", value = 15 }]

[stage.smoke]
command = '''mkdir -p smoke && for i in 0 1 2 3 4 5 6 7; do
  printf '{"step": %d, "loss": 2.5}\n' $i >> smoke/metrics.jsonl; done; sleep 60'''
verify = [{ kind = "json_field", path = "smoke/metrics.jsonl", field = "loss", op = "<", value = 1000 }]
"""


@asynccontextmanager
async def _dashboard(tmp_path, plan_text: str, auto: bool = False) -> AsyncIterator[tuple[NodedeckApp, Pilot]]:
    """The dashboard on plan_text run on the local node (see local_plan), once it has polled; the plan's
    sessions killed after."""
    plan, name = local_plan(tmp_path, plan_text, "tui")
    src = LiveSource(plan_path=plan, timeout=5, auto=auto)
    app = NodedeckApp(src, refresh_s=0.2)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_polled(app, pilot, timeout=30)
            yield app, pilot
    finally:
        src.close()
        kill_plan_sessions(name)


def metrics_line(step: int) -> str:
    return json.dumps({"step": step, "loss": 5.0 / (step + 1), "lr": 1e-4, "acc_0": step / 100,
                       "total_steps": 100}) + "\n"


@aio
async def test_training_metrics_and_followed_todos_update_live(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(metrics_line(i) for i in range(10)) + "{not json\n")
    todos = tmp_path / "todos.json"
    todos.write_text(json.dumps({"todos": [{"id": "1", "content": "read ten regenerated answers by hand",
                                            "status": "in_progress"}]}))
    src = LiveSource(node="local", metrics_path=str(metrics), follow_todo=todos, timeout=5)
    app = NodedeckApp(src, refresh_s=0.2)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_polled(app, pilot, timeout=30)
            panel = app.dash.query_one(TrainingPanel)
            await until(pilot, lambda: panel.view.snapshot is not None and panel.view.snapshot.step == 9, 10, "step 9")
            stats = "\n".join(t.plain for t in app.dash.query_one("#training-chart", LineChart).stats)
            assert "step 9/100" in stats and "loss 0.5000" in stats and "1 malformed lines skipped" in stats
            assert len(panel.view.series["loss"]) == 10 and panel.second == "acc_0"
            plan = app.dash.query_one(PlanList)
            await until(pilot,
                        lambda: "read ten regenerated answers by hand"
                        in str(plan.query(".todo-item").first().render()),
                        10, "the followed todo")
            assert "no plan loaded" in str(plan.query_one("#plan-note").render())

            with metrics.open("a") as f:
                f.writelines(metrics_line(i) for i in range(10, 50))
            await until(pilot, lambda: panel.view.snapshot.step == 49, 10, "step 49")
            assert len(panel.view.series["loss"]) == 50
            assert app.dash.query_one("#training-chart", LineChart).figure_shown

            todos.write_text(json.dumps({"todos": [
                {"id": "1", "content": "read ten regenerated answers by hand", "status": "completed"},
                {"id": "2", "content": "download the checkpoint before shutdown", "status": "pending"}]}))
            await until(pilot, lambda: len(plan.query(".todo-item")) == 2, 10, "two todos")
            assert "completed" in str(plan.query(".todo-item").first().render())
    finally:
        src.close()


@aio
async def test_wizard_key_opens_the_decommission_screen_for_the_shown_node(tmp_path):
    from tui.screens.decommission import DecommissionScreen

    src = LiveSource(node="local", timeout=5)
    app = NodedeckApp(src, refresh_s=0.5)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_polled(app, pilot, timeout=30)
            await pilot.press("D")
            await until(pilot, lambda: isinstance(app.screen, DecommissionScreen), 10, "wizard")
            assert app.screen.node_name == "local"
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, DecommissionScreen), 10, "dashboard")
    finally:
        src.close()


@aio
async def test_inference_panel_from_a_real_metrics_endpoint_with_a_baseline(tmp_path):
    from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

    from ops.state import StateStore
    from ops.telemetry.baseline import Baseline, save_baseline
    from tests.support.sshd import free_port

    reg = CollectorRegistry()
    gauges = {name: Gauge(f"sglang:{name}", name, ["model_name"], registry=reg)
              for name in ("num_running_reqs", "num_queue_reqs", "token_usage", "gen_throughput",
                           "spec_accept_length", "spec_accept_rate")}
    generated = Counter("sglang:generation_tokens", "generated tokens", ["model_name"], registry=reg)
    for name, value in (("num_running_reqs", 4), ("num_queue_reqs", 1), ("token_usage", 0.5),
                        ("gen_throughput", 300.0), ("spec_accept_length", 3.2), ("spec_accept_rate", 0.55)):
        gauges[name].labels(model_name="target").set(value)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    write_nodes_toml(f'[nodes.local]\nmetrics_url = "http://127.0.0.1:{port}/metrics"\n')
    store = StateStore.for_node("local")
    save_baseline(store, Baseline(150.0, label="plain target"))
    store.close()

    src = LiveSource(node="local", timeout=5)
    app = NodedeckApp(src, refresh_s=0.2)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_polled(app, pilot, timeout=30)
            chart = app.dash.query_one("#inference-chart", LineChart)

            def stats() -> str:
                return "\n".join(t.plain for t in chart.stats)

            await until(pilot, lambda: "sglang" in stats(), 10, "the server's metrics")
            text = stats()
            assert "accept len 3.20 (55%)" in text and "run 4 · queue 1" in text and "kv 50%" in text
            generated.labels(model_name="target").inc(1000)  # the counter's rate is what tok/s shows
            await until(pilot, lambda: "vs 150 baseline" in stats(), 10, "speedup against the baseline")
            await until(pilot, lambda: chart.figure_shown, 10, "the tok/s chart")
    finally:
        src.close()
        server.shutdown()


@aio
async def test_training_panel_follows_the_metrics_of_the_launched_stage(tmp_path):
    async with _dashboard(tmp_path, PLAN) as (app, pilot):
        panel = app.dash.query_one(TrainingPanel)
        assert panel.view.snapshot is None and panel.view.note == "training metrics appear once stage train starts"
        await pilot.press("s")
        await until(pilot, lambda: panel.view.snapshot is not None and panel.view.snapshot.step == 7, 20,
                    "the smoke run's metrics")
        assert panel.view.snapshot.path == str(tmp_path / "work" / "smoke" / "metrics.jsonl")


PROGRESS_PLAN = r"""
[plan]
name = "NAME"
node = "local"

[[stage]]
id = "tokenize"
title = "Tokenize (writes progress records)"
command = '''printf '{"ts": 1, "done": 10, "total": 300, "unit": "samples", "rate": 5}\n' >> "$NODEDECK_PROGRESS"
printf '{"ts": 2, "done": 150, "total": 300, "unit": "samples", "rate": 25}\n{"ts": 3, "do' >> "$NODEDECK_PROGRESS"
sleep 60'''

[[stage]]
id = "quiet"
title = "A step without progress records"
command = '''while true; do echo some output line; sleep 0.1; done'''
"""


@aio
async def test_running_stages_show_a_progress_bar_or_their_log_growth(tmp_path):
    async with _dashboard(tmp_path, PROGRESS_PLAN, auto=True) as (app, pilot):
        plan_list = app.dash.query_one(PlanList)

        def row(sid):
            text = plan_list.stages.text_of(sid)
            return "" if text is None else text.plain

        await until(pilot, lambda: "150/300 samples" in row("tokenize"), 20, "the progress bar")
        assert "█" in row("tokenize") and "25 samples/s" in row("tokenize") and "ETA 6s" in row("tokenize")
        await until(pilot, lambda: "B/s" in row("quiet"), 20, "the log's growth rate")
        assert "log 0 B" not in row("quiet")


RERUN_PLAN = r"""
[plan]
name = "NAME"
node = "local"

[[stage]]
id = "train"
title = "Train: a smoke run, then the full run"
command = '''mkdir -p full && for i in 0 1 2 3 4 5 6 7 8 9; do
  printf '{"step": %d, "loss": 1.5}\n' $i >> full/metrics.jsonl; done; sleep 60'''
verify = [{ kind = "json_field", path = "full/metrics.jsonl", field = "loss", op = "<", value = 15 }]

[stage.smoke]
command = '''mkdir -p smoke && for i in 0 1 2 3 4 5; do
  printf '{"step": %d, "loss": 3.0}\n' $i >> smoke/metrics.jsonl; done'''
verify = [{ kind = "json_field", path = "smoke/metrics.jsonl", field = "loss", op = "<", value = 1000 }]
"""


@aio
async def test_the_previous_run_of_the_stage_is_overlaid_on_the_loss_chart(tmp_path):
    async with _dashboard(tmp_path, RERUN_PLAN, auto=True) as (app, pilot):
        panel = app.dash.query_one(TrainingPanel)
        await until(pilot, lambda: panel.view.snapshot is not None and panel.view.snapshot.path.endswith(
            "full/metrics.jsonl") and panel.view.snapshot.step == 9, 30, "the full run's metrics")
        await until(pilot, lambda: len(panel.view.previous) == 6, 10, "the smoke run's loss")
        assert set(panel.view.previous.y) == {3.0} and panel.view.previous_label == "smoke run 1"

"""Server stage states as shown (issue 31, item 15): a server stopped after it was up is `completed, down
now` and not counted done in the header; a check is listed once; the Inference panel shows the baseline the
Outcome panel shows; a finished, verified stage is one line in the todo panel until selected."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

from ops.outcome import Measurement
from ops.run.views import StageState as S
from tests.support.sshd import free_port
from tests.support.tui_fixed import FixedSource
from tests.support.tui_screens import aio, until, wait_polled
from tests.test_plan_scheduler import env, run_until  # noqa: F401 - env is the fixture
from tui.app import NodedeckApp
from tui.source import PlanView
from tui.widgets.charts import LineChart
from tui.widgets.plan import PlanList, plan_title, stage_text


def test_a_server_stopped_after_it_was_up_lists_each_check_once_and_is_not_counted_done(env):  # noqa: F811
    port = free_port()
    (env.root / "health").write_text("ok")             # http.server answers 200 for a file of that name
    (env.root / "health_generate").write_text("ok")
    plan = env.plan(f'''
[[stage]]
id = "srv"
kind = "server"
command = "exec python3 -m http.server {port} --bind 127.0.0.1"
verify = [
  {{ kind = "http_ok", url = "http://127.0.0.1:{port}/health", timeout = 2 }},
  {{ kind = "http_ok", url = "http://127.0.0.1:{port}/health_generate", timeout = 2 }},
]
''')
    s = env.scheduler(plan, auto=True, server_check_interval=0.05)
    run_until(s, lambda r: r.views[0].state is S.COMPLETED)
    time.sleep(0.1)
    res, _ = run_until(s, lambda r: r.views[0].state is S.COMPLETED)   # seen up: its checks are liveness ones
    up = res.views[0]
    urls = [c.text for c in up.checks if c.kind == "http_ok"]
    assert len(urls) == len(set(urls)) == 1, up.checks     # /health_generate became /health: listed once
    assert not up.down_after_up and plan_title(PlanView(plan.name, [up])).endswith("1/1 done")

    down = s.stop("srv", grace=2.0)
    assert down.state is S.COMPLETED and down.down_after_up    # it did its part: dependents may go on
    assert len([c for c in down.checks if c.kind == "http_ok"]) == 1
    title = plan_title(PlanView(plan.name, [down]))
    assert "0/1 done" in title and "1 server down" in title, title
    text = stage_text(down, time.time()).plain
    assert "completed, down now" in text and "now that it is down" in text, text


class Measured(FixedSource):
    """The server has no stored baseline; the plan's benchmark measured one (the Outcome panel's)."""

    def poll_inference(self, window_s=None):
        view = super().poll_inference(window_s)
        snap = replace(view.snapshot, baseline_tokens_per_s=None, speedup_vs_baseline=None)
        return replace(view, snapshot=snap, baseline=Measurement(812.0, "bench_baseline stage"))


@aio
async def test_the_inference_panel_shows_the_measured_baseline():
    app = NodedeckApp(Measured(), refresh_s=3600)
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_polled(app, pilot)
        text = "\n".join(t.plain for t in app.dash.query_one("#inference-chart", LineChart).stats)
        assert "no baseline measured" not in text and "baseline 812 tok/s (bench_baseline stage)" in text, text


@aio
async def test_finished_stages_fold_to_one_line_and_unfold_when_selected_or_failed():
    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_polled(app, pilot)
        plan = app.dash.query_one(PlanList)

        def lines(sid: str) -> list[str]:
            text = plan.stages.text_of(sid)
            return [] if text is None else text.plain.splitlines()

        assert len(lines("prep-sharegpt")) == 1 and "1 check pass" in lines("prep-sharegpt")[0]
        assert len(lines("bench")) == 1                   # skipped: nothing to show but that
        assert len(lines("vocab")) > 1                    # failed: whole, with the failing check
        assert len(lines("regen")) > 1                    # running: whole
        await pilot.press(*["up"] * 10)                   # select the first: it unfolds
        await until(pilot, lambda: app.selected_stage().id == "prep-sharegpt", what="selected")
        await until(pilot, lambda: len(lines("prep-sharegpt")) > 1, what="unfolded")
        assert "min_lines" in "\n".join(lines("prep-sharegpt"))
        await pilot.press("down")                         # and folds again when left
        await until(pilot, lambda: len(lines("prep-sharegpt")) == 1, what="folded again")


def test_the_live_source_gives_the_inference_panel_the_outcomes_baseline(tmp_path, monkeypatch):
    from ops.telemetry.snapshots import InferenceSnapshot
    from tests.support.tmux_sessions import kill_plan_sessions
    from tui.live import LiveSource

    work = tmp_path / "work"
    (work / "bench").mkdir(parents=True)
    (work / "bench" / "baseline.json").write_text('{"output_throughput": 812.0}')   # SGLang's benchmark, no drafter
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{work}"\nmetrics_url = "http://127.0.0.1:1/metrics"\n')
    name = f"b{uuid.uuid4().hex[:8]}"
    plan = tmp_path / "plan.toml"
    plan.write_text(f'[plan]\nname = "{name}"\n[[stage]]\nid = "bench_baseline"\ncommand = "true"\n'
                    'outputs = ["bench/baseline.json"]\n[[stage]]\nid = "a"\ncommand = "true"\n')
    src = LiveSource(config_path=cfg, node="local", plan_path=plan, timeout=5)
    served = InferenceSnapshot(ts=time.time(), server="sglang", gen_tokens_per_s=300.0)   # no stored baseline
    monkeypatch.setattr(src._feed.telemetry, "poll_inference", lambda *a, **k: served)
    try:
        assert src.poll_outcome().outcome.baseline_tok_s == Measurement(812.0, "stage bench_baseline")
        assert src.poll_inference().baseline == Measurement(812.0, "stage bench_baseline")
        assert src.start("a", smoke=False)             # the stage actions still answer after an outcome poll
    finally:
        src.close()
        kill_plan_sessions(name)

"""The Outcome panel: the pipeline's result on the dashboard, loud when speculation is slower."""

from __future__ import annotations

import json

from textual.notifications import Notification

from tests.support.tui_fixed import FixedSource
from tests.support.tui_screens import Seen, aio, until, wait_polled
from tui.app import NodedeckApp
from tui.live import LiveSource
from tui.widgets.outcome import OutcomePanel


def _text(app: NodedeckApp) -> str:
    return app.dash.query_one(OutcomePanel).text.plain


@aio
async def test_outcome_shows_acceptance_throughputs_and_speedup():
    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_polled(app, pilot)
        text = _text(app)
        assert "accept len 3.41 (untrained 1.00)" in text
        assert "with drafter 361.2 tok/s" in text and "without 158.0 tok/s" in text and "2.29×" in text
        assert "faster than no speculation" in text
        assert not app.dash.query_one(OutcomePanel).has_class("-slower")
        assert not app._notifications


@aio
async def test_speculation_slower_than_the_baseline_is_loud_and_notified_once():
    seen = Seen()
    app = NodedeckApp(FixedSource(slower=True), refresh_s=0.1)
    async with app.run_test(size=(120, 40), message_hook=seen) as pilot:
        await wait_polled(app, pilot)
        panel = app.dash.query_one(OutcomePanel)
        assert "0.66×" in _text(app) and "SPECULATION IS SLOWER than no speculation: 0.66x" in _text(app)
        assert panel.has_class("-slower")
        # the panel polls no faster than every 5 s: force two more polls, still one notification
        for _ in range(2):
            before = len(seen.results(OutcomePanel))
            panel.poll_now()
            await until(pilot, lambda: len(seen.results(OutcomePanel)) > before,
                        5, "another outcome poll")
        notes: list[Notification] = list(app._notifications)
        assert [n.message for n in notes if n.title == "Outcome"] == [panel.view.outcome.verdict()]


BENCH = {"backend": "sglang", "completed": 200}


@aio
async def test_outcome_from_the_plans_result_files_on_the_node(tmp_path):
    root = tmp_path / "work"
    (root / "bench").mkdir(parents=True)
    (root / "eval.json").write_text(json.dumps({"mean_accept_len": 1.15, "untrained": {"mean_accept_len": 1.0}}))
    (root / "bench" / "base.jsonl").write_text(json.dumps({**BENCH, "output_throughput": 160.0}) + "\n")
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{root}"\n')
    plan = tmp_path / "p.toml"
    plan.write_text('[plan]\nname = "outcome-panel"\nnode = "local"\n'
                    '[[stage]]\nid = "eval"\ncommand = "true"\noutputs = ["eval.json"]\n'
                    '[[stage]]\nid = "bench_baseline"\ncommand = "true"\noutputs = ["bench/base.jsonl"]\n'
                    '[[stage]]\nid = "bench_eagle"\ncommand = "true"\noutputs = ["bench/spec.jsonl"]\n')
    src = LiveSource(config_path=cfg, plan_path=plan, timeout=5)
    app = NodedeckApp(src, refresh_s=0.2)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_polled(app, pilot, timeout=30)
            text = _text(app)
            assert "accept len 1.15 (untrained 1.00)" in text and "without 160.0 tok/s" in text
            assert "speedup not measured yet" in text and "from stage eval, stage bench_baseline" in text
            # the drafter's benchmark lands: the next poll shows the 0.66x verdict
            (root / "bench" / "spec.jsonl").write_text(json.dumps({**BENCH, "accept_length": 1.15,
                                                                   "output_throughput": 105.6}) + "\n")
            app.dash.query_one(OutcomePanel).poll_now()
            await until(pilot, lambda: "0.66×" in _text(app), 10, "the 0.66x speedup")
            assert "SPECULATION IS SLOWER" in _text(app)
    finally:
        src.close()


@aio
async def test_without_a_plan_the_panel_says_where_the_outcome_comes_from():
    src = LiveSource(node="local", timeout=5)
    app = NodedeckApp(src, refresh_s=0.5)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_polled(app, pilot, timeout=30)
            assert "no plan loaded" in _text(app)
    finally:
        src.close()

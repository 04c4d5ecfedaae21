"""The train-serve line on the dashboard (issue 43 items 1 and 4): the Outcome panel puts the eval's acceptance
beside each engine's, with the per-position curve drawn as bars, and a gap in red with its causes, notified once;
the Inference panel draws the served acceptance over time against the eval's line, and per position."""

from __future__ import annotations

from textual.notifications import Notification

from ops.outcome import from_results
from tests.support.tui_fixed import EVAL_RESULT, NOW, FixedSource
from tests.support.tui_screens import aio, until, wait_polled
from tui.app import NodedeckApp
from tui.source import OutcomeView
from tui.widgets.charts import LineChart
from tui.widgets.inference import InferencePanel
from tui.widgets.outcome import OutcomePanel, position_bars

VLLM_BENCH = {"output_throughput": 361.2, "spec_decode_acceptance_length": 3.38, "spec_decode_num_drafts": 640,
              "spec_decode_per_position_acceptance_rates": [0.84, 0.63, 0.45, 0.29, 0.17],
              "engine": {"name": "vLLM", "version": "0.32.0"}}
COLLAPSED = {**VLLM_BENCH, "spec_decode_acceptance_length": 1.03,
             "spec_decode_per_position_acceptance_rates": [0.03, 0.0, 0.0, 0.0, 0.0]}


class Served(FixedSource):
    """The fixed dashboard with vLLM's benchmark beside the eval; `bench` is swapped to turn it into a collapse."""

    def __init__(self, bench: dict):
        super().__init__()
        self.bench = bench

    def poll_outcome(self) -> OutcomeView:
        results = [("stage eval", EVAL_RESULT), ("stage bench-base", {"output_throughput": 158.0}),
                   ("stage bench", self.bench)]
        return OutcomeView(from_results(results, greedy={"stage bench": True}))


def test_position_bars_draw_each_share_as_a_bar():
    assert position_bars((1.0, 0.5, 0.0)) == "█▄ "
    assert position_bars((0.85, 0.64, 0.46, 0.29, 0.17)) == "▇▅▄▂▁"


@aio
async def test_outcome_puts_the_eval_beside_the_engine_and_a_gap_is_red_and_notified_once():
    src = Served(VLLM_BENCH)
    app = NodedeckApp(src, refresh_s=0.1)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_polled(app, pilot)
        panel = app.dash.query_one(OutcomePanel)
        text = panel.text.plain
        assert "acceptance eval 3.41 ▇▅▄▂▁ · vLLM 0.32.0 3.38 ▇▅▄▂▁ ✓ ±" in text
        assert not panel.has_class("-slower")
        src.bench = COLLAPSED
        for _ in range(2):
            panel.poll_now()
            await until(pilot, lambda: "GAP" in panel.text.plain, 10, "the collapsed benchmark shown")
        text = panel.text.plain
        assert "vLLM 0.32.0 1.03       ✗ gap" in text     # five bars of (almost) nothing
        assert "✗ vLLM 0.32.0 1.03 vs eval 3.41: TRAIN-SERVE GAP of -2.38" in text
        assert "parting from draft position 1" in text and panel.has_class("-slower")
        notes: list[Notification] = list(app._notifications)
        assert [n.title for n in notes].count("Train-serve gap") == 1


@aio
async def test_inference_draws_served_acceptance_over_time_against_the_eval_and_per_position():
    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_polled(app, pilot)
        chart = app.dash.query_one("#inference-chart", LineChart)
        assert [type(w) for w in app.dash.query_one(InferencePanel).children] == [LineChart]   # still one widget
        left, right, _, _, _, right_overlay = chart._last
        assert left[0] == "tok/s" and right[0] == "accept len" and len(right[1]) == 61
        assert right_overlay[0] == "eval accept len" and set(right_overlay[1].y) == {3.41}
        assert right_overlay[1].x == (NOW - 300, NOW)        # the eval's line spans the window (5 min) to now
        stats = "\n".join(t.plain for t in chart.stats)
        assert "accept len 3.41 (61%) · eval 3.41" in stats
        # SGLang exposes no per-position count: the eval's curve is drawn, the served one says so
        assert "per draft position not exposed eval ▇▅▄▂▁" in stats


def test_prompts_that_part_with_a_cause_found_get_a_yellow_line_though_the_means_agree():
    from dataclasses import replace

    from ops.acceptance import Check
    from tests.test_train_serve import EVAL_2L, VLLM_2L
    from tui.widgets.outcome import acceptance_text

    o = from_results([("stage evaluate", EVAL_2L), ("stage probe", VLLM_2L)])
    [v] = o.train_serve
    kernel = Check("engine kernel", False, "vLLM 0.32.0 on CPU: layer 0's k_norm on every layer's context keys")
    text = acceptance_text(replace(o, train_serve=(replace(v, checks=(kernel,)),)))
    assert "vLLM 0.32.0+cpu 2.42" in text.plain and "✓ ±0.07" in text.plain
    [line] = [span for span in text.split() if span.plain.startswith("! ")]
    assert "4 of 6 prompts part round for round; causes: engine kernel: vLLM 0.32.0 on CPU" in line.plain
    assert "yellow" in str(text.spans[-1].style)

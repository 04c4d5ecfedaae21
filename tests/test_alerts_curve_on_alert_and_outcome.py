"""Review regressions for the training-curve alerts: real resets must not be missed for one weak epoch."""

from __future__ import annotations

import numpy as np
import pytest

from ops.alerts.records import AlertKind, Thresholds
from ops.alerts.rules import curve

TH = Thresholds()


@pytest.mark.parametrize("seed", range(5))
def test_resets_with_one_weak_epoch_still_alert(seed):
    """Ten epochs reset the loss; in one of them the reset is small (bucket order varies). Still the symptom."""
    rng = np.random.default_rng(seed)
    i = np.arange(400)
    x = i * 10.0
    amp = np.where(i // 40 == 5, 0.05, 0.6)
    y = 2 + 3 * np.exp(-x / 800) + amp * (1 - (i % 40) / 40) + rng.normal(0, 0.03, i.size)
    kinds = [f.alert.kind for f in curve("n", "m", x, y, TH)]
    assert kinds == [AlertKind.LOSS_RESETS]
    [f] = curve("n", "m", x, y, TH)
    assert "every ~400 steps" in f.alert.message


@pytest.mark.parametrize("seed", range(30))
def test_heavy_tailed_noise_without_resets_stays_quiet(seed):
    rng = np.random.default_rng(seed)
    x = np.arange(400) * 10.0
    y = (2 + 3 * np.exp(-x / 800)) * (1 + 0.05 * rng.standard_t(2, x.size))
    assert [f for f in curve("n", "m", x, y, TH) if f.alert.kind is AlertKind.LOSS_RESETS] == []


def test_on_alert_past_its_timeout_is_stopped_with_its_children(tmp_path):
    """`curl ...; sleep` style commands fork: the timeout must not wait for the children holding the pipes."""
    import time

    from ops.alerts.hooks import run_on_alert
    from ops.alerts.records import Alert

    alert = Alert("gpu1", AlertKind.STAGE_STALLED, "train", "stage train has not advanced", "log unchanged",
                  since=1.0)
    t0 = time.monotonic()
    mark = tmp_path / "still-ran"
    err = run_on_alert(f"echo 'it''s \"quoted\"'; (sleep 3; touch {mark})", alert, timeout=1.0)
    assert time.monotonic() - t0 < 10
    assert err is not None and "ran past 1s" in err
    time.sleep(3.5)
    assert not mark.exists(), "the command said 'stopped' but its children kept running"


def test_outcome_never_divides_a_serving_benchmark_by_an_eval_baseline():
    """The trainer's eval measures tokens/s in its own harness; SGLang's benchmark measures serving.
    A drafter-only serving benchmark over the eval's baseline is a made-up 18x speedup."""
    from ops.outcome import from_results

    ev = {"mean_accept_len": 3.0, "tokens_per_s": 50.0, "baseline_tokens_per_s": 20.0}
    bench = {"backend": "sglang", "output_throughput": 373.0, "accept_length": 3.1}
    o = from_results([("stage eval", ev), ("stage bench_eagle", bench)])
    assert round(o.speedup.value, 2) == 2.5
    assert o.drafter_tok_s.source == o.baseline_tok_s.source == "stage eval"
    only = from_results([("stage eval", {"mean_accept_len": 3.0, "baseline_tokens_per_s": 20.0}),
                         ("stage bench_eagle", bench)])
    assert only.speedup is None and only.verdict().startswith("speedup not measured yet")


def test_on_alert_is_not_rerun_for_the_same_alert_after_a_gap_in_watching(tmp_path):
    """`nodedeck alerts --all` from cron every 10 minutes: a condition that never went away is one alert,
    announced once; once it is seen resolved, its return is a new alert."""
    from ops.alerts.records import Alert, Severity
    from ops.alerts.rules import Finding
    from ops.alerts.tracker import AlertTracker
    from ops.state import StateStore

    tracker = AlertTracker(StateStore(tmp_path / "s.sqlite"))
    f = [Finding(Alert("gpu1", AlertKind.RETIRE_UNPRESERVED, "node", "due", "3 not preserved", Severity.CRITICAL))]
    t0 = 1_000_000.0
    assert len(tracker.claim_new(tracker.update("gpu1", f, t0))) == 1
    for k in range(1, 4):                                       # one-shot runs, 10 minutes apart
        active = tracker.update("gpu1", f, t0 + 600 * k)
        assert len(active) == 1 and tracker.claim_new(active) == []
    assert tracker.update("gpu1", [], t0 + 2500) == []          # seen resolved
    assert len(tracker.claim_new(tracker.update("gpu1", f, t0 + 2600))) == 1


def test_outcome_result_path_that_is_a_fifo_never_blocks(tmp_path):
    """`plan outcome` (and the dashboard's closing summary) read the stages' result files: a FIFO there
    must be skipped, not waited on forever."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    fifo = tmp_path / "eval.json"
    os.mkfifo(fifo)
    code = ("from ops.hosts.local import LocalHost\nfrom ops.outcome import last_record\n"
            f"print(last_record(LocalHost(), {str(fifo)!r}))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=20,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert res.returncode == 0 and res.stdout.decode().strip() == "None", res.stderr

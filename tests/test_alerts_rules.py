"""Alert rules on recorded and generated data: each fires on its symptom and stays quiet without it."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

from ops.alerts.hooks import run_on_alert
from ops.alerts.records import AlertKind, Thresholds, parse_when
from ops.alerts.rules import (
    PreservedSummary,
    curve,
    disk_before_eta,
    find_jumps,
    gpu_idle,
    retiring,
    speculation,
    stalled,
)
from ops.alerts.tracker import AlertTracker
from ops.errors import UserError
from ops.hosts.local import LocalHost
from ops.state import StateStore
from ops.telemetry.baseline import Baseline
from ops.telemetry.inference import InferenceMetrics
from ops.telemetry.snapshots import DiskUsage, Gpu, GpuSnapshot, HostSnapshot

DATA = Path(__file__).parent / "data" / "telemetry"
TH = Thresholds()


def sawtooth(n=3000, period=500, noise=0.03, seed=0, resets=True):
    """Loss that decays within each epoch; with resets it jumps back up at every epoch boundary
    (homogeneous length buckets), without them the same decay continues across epochs."""
    rng = np.random.default_rng(seed)
    steps = np.arange(n, dtype=float)
    phase = steps % period if resets else steps
    clean = 1.0 + 2.0 * np.exp(-phase / (period / 3 if resets else n / 3))
    return steps, clean + rng.normal(0, noise, n)


@pytest.mark.parametrize("seed", range(5))
def test_a_sawtooth_loss_with_resets_alerts(seed):
    steps, loss = sawtooth(seed=seed)
    [f] = curve("gpu1", "train/metrics.jsonl", steps, loss, TH, epoch_steps=500)
    a = f.alert
    assert a.kind is AlertKind.LOSS_RESETS and "every ~500 steps" in a.message and "epoch boundaries" in a.message
    assert "5 jumps" in a.evidence


@pytest.mark.parametrize("seed", range(5))
def test_the_same_noise_without_resets_stays_quiet(seed):
    steps, loss = sawtooth(seed=seed, resets=False)
    assert curve("gpu1", "m", steps, loss, TH) == []
    flat = np.full(2000, 2.0) + np.random.default_rng(seed).normal(0, 0.2, 2000)   # pure noise, big
    assert curve("gpu1", "m", np.arange(2000), flat, TH) == []


def test_accuracy_resets_are_drops():
    steps, loss = sawtooth(seed=1)
    acc = 1.0 - loss / 4
    [f] = curve("n", "m", steps, acc, TH, name="acc_0", higher_is_better=True)
    assert f.alert.kind is AlertKind.LOSS_RESETS and f.alert.subject == "m:acc_0"


def test_two_jumps_or_irregular_jumps_are_not_periodic():
    y = np.concatenate([np.full(300, 1.0), np.full(300, 2.0), np.full(50, 1.0), np.full(700, 2.0)])
    y = y + np.random.default_rng(0).normal(0, 0.01, y.size)
    assert len(find_jumps(y)) == 2
    assert curve("n", "m", np.arange(y.size), y, TH) == []


def test_nan_and_divergence():
    [f] = curve("n", "m", [1, 2, 3], [2.0, 1.9, float("nan")], TH)
    assert f.alert.kind is AlertKind.LOSS_NAN and "last finite loss: 1.9" in f.alert.evidence
    [f] = curve("n", "m", [1, 2], [2.0, math.inf], TH)
    assert f.alert.kind is AlertKind.LOSS_NAN
    steps = np.arange(400)
    loss = np.concatenate([np.linspace(3, 1, 200), np.linspace(1, 4, 200)])
    kinds = {f.alert.kind for f in curve("n", "m", steps, loss, TH)}
    assert AlertKind.LOSS_DIVERGING in kinds


def test_recorded_sglang_metrics_at_066x_alert():
    m = InferenceMetrics(LocalHost(), "http://127.0.0.1:30000/metrics", baseline=Baseline(160.0))
    snap = m.parse((DATA / "sglang_metrics_spec_slow.txt").read_text(), time.time())
    assert round(snap.speedup_vs_baseline, 2) == 0.66
    [f] = speculation("gpu1", snap, TH)
    assert f.alert.kind is AlertKind.SPEC_SLOWER and "0.66x" in f.alert.message
    assert "accept len 1.31" in f.alert.evidence
    floor = Thresholds(min_accept_len=2.0)
    assert {x.alert.kind for x in speculation("gpu1", snap, floor)} == {AlertKind.SPEC_SLOWER, AlertKind.ACCEPT_LOW}
    fast = InferenceMetrics(LocalHost(), "http://x/metrics", baseline=Baseline(100.0))
    assert speculation("gpu1", fast.parse((DATA / "sglang_metrics_spec_slow.txt").read_text(), time.time()), TH) == []


def _gpus(*utils):
    return GpuSnapshot(ts=time.time(), available=True, gpus=[Gpu(i, util_pct=u) for i, u in enumerate(utils)])


def test_gpu_idle_holds_before_it_is_raised(tmp_path):
    tracker = AlertTracker(StateStore(tmp_path / "s.sqlite"))
    th = Thresholds(gpu_idle_s=600)
    findings = gpu_idle("gpu1", _gpus(0, 1, 2, 0), ["train"], th)
    assert gpu_idle("gpu1", _gpus(0, 80), ["train"], th) == [] and gpu_idle("gpu1", _gpus(0, 0), [], th) == []
    t0 = 1_000_000.0
    assert tracker.update("gpu1", findings, t0) == []
    assert tracker.update("gpu1", findings, t0 + 300) == []
    [a] = tracker.update("gpu1", findings, t0 + 600)
    assert a.since == t0 and "while train runs" in a.message
    assert tracker.update("gpu1", [], t0 + 610) == []                     # resolved: starts over
    assert tracker.update("gpu1", findings, t0 + 620) == []
    assert tracker.update("gpu1", findings, t0 + 620 + 1000 + 400) == []   # nobody watched for 1000 s


def test_on_alert_runs_once_per_alert_even_with_two_watchers(tmp_path):
    db = tmp_path / "s.sqlite"
    out = tmp_path / "fired.txt"
    cmd = f'printf "%s|%s\\n" "$NODEDECK_ALERT_KIND" "$(cat)" >> {out}'
    finding = speculation("gpu1", InferenceMetrics(LocalHost(), "http://x/metrics", baseline=Baseline(160.0)).parse(
        (DATA / "sglang_metrics_spec_slow.txt").read_text(), time.time()), TH)
    a, b = AlertTracker(StateStore(db)), AlertTracker(StateStore(db))
    for _ in range(3):
        for tracker in (a, b):
            for alert in tracker.claim_new(tracker.update("gpu1", finding)):
                assert run_on_alert(cmd, alert) is None
    lines = out.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spec_slower|{") and '"node": "gpu1"' in lines[0]
    assert "exited 3" in run_on_alert("echo boom >&2; exit 3", a.update("gpu1", finding)[0])


def test_stalled_disk_and_retire():
    assert stalled("n", "train", 100, TH) == []
    [f] = stalled("n", "train", 2000, TH)
    assert f.alert.kind is AlertKind.STAGE_STALLED and "33m20s" in f.alert.message
    host = HostSnapshot(ts=time.time(), disks=[DiskUsage("/data", 10 * 2**40, 9 * 2**40, 2**40, 2**20 * 100, 10995.0)])
    [f] = disk_before_eta("n", host, "hidden_states", 20000, TH)
    assert "before hidden_states ends" in f.alert.message
    assert disk_before_eta("n", host, "hidden_states", 5000, TH) == []
    now = 1_000_000.0
    assert retiring("n", now + 3 * 86400, now, None, TH) == []
    [f] = retiring("n", now + 3600, now, None, TH)
    assert "nothing has checked" in f.alert.message
    [f] = retiring("n", now - 60, now, PreservedSummary(now - 100, True, 96, 3), TH)
    assert "3 of 96 files not preserved" in f.alert.message and "was due" in f.alert.message
    assert retiring("n", now - 60, now, PreservedSummary(now - 100, False, 96, 0), TH) == []


def test_thresholds_from_tables_are_checked():
    th = Thresholds.from_table({"min_speedup": 1.2, "reset_min_jumps": 4}, "p.toml:3")
    assert th.min_speedup == 1.2 and th.reset_min_jumps == 4
    with pytest.raises(UserError, match=r"p.toml:3: unknown alert threshold 'nope'"):
        Thresholds.from_table({"nope": 1}, "p.toml:3")
    with pytest.raises(UserError, match="must be a number"):
        Thresholds.from_table({"stall_s": "x"}, "p.toml:3")
    assert parse_when("2026-12-05T18:00Z", "f") == 1796493600.0
    with pytest.raises(UserError, match="expected a date and time"):
        parse_when("friday", "f")

"""NodeTelemetry: histories, stale snapshots, and a dead or hung node never blocking the caller."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ops.hosts.local import LocalHost
from ops.hosts.ssh import SSHHost
from ops.telemetry.baseline import Baseline
from ops.telemetry.collector import NodeTelemetry
from ops.telemetry.series import GpuField, GpuKey, InferenceSeries, TrainingKey
from tests.test_telemetry_gpus import fake_smi
from tests.test_telemetry_inference import MetricsServer, sglang_text


class HangingHost(LocalHost):
    """A node whose commands and file reads hang until released (a wedged transport)."""

    kind = "ssh"

    def __init__(self):
        super().__init__("hung")
        self.hang = threading.Event()
        self.release = threading.Event()
        self.entered = 0

    def _maybe_hang(self):
        if self.hang.is_set():
            self.entered += 1
            self.release.wait(30)

    def run(self, argv, **kw):
        self._maybe_hang()
        return super().run(argv, **kw)

    def stat(self, path):
        self._maybe_hang()
        return super().stat(path)


def test_gpu_poll_over_nvidia_smi_feeds_per_gpu_history(tmp_path):
    smi = fake_smi(tmp_path, "smi_h100_8gpu_gpus.csv", "smi_h100_8gpu_apps.csv")
    tel = NodeTelemetry(LocalHost(), nvml=False, nvidia_smi=smi)
    try:
        s1 = tel.poll_gpus()
        s2 = tel.poll_gpus()
    finally:
        tel.close()
    assert s1.available and not s2.stale
    xs, ys = tel.history.get(GpuKey(0))
    assert ys.tolist() == [100.0, 100.0] and xs[1] >= xs[0]
    assert tel.history.get(GpuKey(0, GpuField.TEMP_C))[1].tolist() == [61.0, 61.0]
    assert set(tel.history.keys()) == {GpuKey(i, f) for i in range(8) for f in GpuField}
    assert tel.last("gpus") is s2


def test_nvml_is_read_by_the_sampler_never_in_nodedeck_s_own_process():
    """One GPU reader: `local`'s first poll is already the sampler's NVML answer (no one-shot script first), and
    nodedeck's process never loads NVML itself."""
    code = ("import sys\n"
            "from ops.hosts.local import LocalHost\n"
            "from ops.telemetry.collector import NodeTelemetry\n"
            "tel = NodeTelemetry(LocalHost(), timeout=60)\n"
            "snap = tel.poll_gpus()\n"
            "tel.close()\n"
            "print(snap.source, snap.stale, 'pynvml' in sys.modules, tel.sampler.starts)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.split() == ["nvml", "False", "False", "1"], out.stderr


def test_hung_node_returns_last_good_data_marked_stale_within_timeout(tmp_path):
    host = HangingHost()
    # the one-shot path of a node without python3 (a hung sampler is tested in test_telemetry_sampler.py)
    tel = NodeTelemetry(host, timeout=15.0, watch_paths=[str(tmp_path)], sampler_python="no-such-python3")
    good = tel.poll_host()
    assert not good.stale and good.error is None
    tel.timeout = 0.5
    host.hang.set()
    try:
        t0 = time.monotonic()
        s = tel.poll_host()
        waited = time.monotonic() - t0
        assert waited < 0.5 + 0.25 + 1.0  # bounded by the timeout (plus the guard's grace)
        assert s.stale and "no answer from hung within 0.5s" in s.error
        assert s.ts == good.ts and s.age_s >= waited * 0.9
        assert s.ram_total == good.ram_total  # the last good data, not blanks
        again = tel.poll_host()  # the first poll is still stuck: no second one piles up
        assert again.stale and "previous poll still running" in again.error
        assert host.entered == 1
    finally:
        host.release.set()
    tel.timeout = 15.0
    for _ in range(100):
        fresh = tel.poll_host()
        if not fresh.stale:
            break
        time.sleep(0.02)
    assert not fresh.stale and fresh.ts > good.ts


def test_first_poll_failing_gives_an_empty_stale_snapshot(tmp_path):
    tel = NodeTelemetry(LocalHost())
    s = tel.poll_training(str(tmp_path / "nope.jsonl"))
    assert s.stale and "no such file" in s.error and s.step is None and s.path.endswith("nope.jsonl")
    log = tel.follow_log(str(tmp_path / "nope.log"))
    assert log.stale and log.lines == []


def test_dead_ssh_node_is_stale_then_recovers(sshd, tmp_path):
    host = SSHHost("testnode", "testnode", ssh_config=sshd.ssh_config, connect_timeout=10.0)
    tel = NodeTelemetry(host, timeout=15.0, watch_paths=[str(sshd.root)])  # generous while healthy: CI is slow
    try:
        g = tel.poll_gpus()  # no nvidia-smi behind this sshd: a normal state
        assert not g.available and g.reason == "nvidia-smi not found on the node" and not g.stale
        h = tel.poll_host()
        assert not h.stale
        host.connect_timeout, tel.timeout = 1.0, 2.0
        sshd.stop()
        t0 = time.monotonic()
        h2 = tel.poll_host()
        g2 = tel.poll_gpus()
        assert time.monotonic() - t0 < 2 * (2.0 + 1.0)
        assert h2.stale and h2.error and h2.ts == h.ts
        assert g2.stale and g2.reason == g.reason
        host.connect_timeout, tel.timeout = 10.0, 15.0
        sshd.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            h3 = tel.poll_host()
            if not h3.stale:
                break
            time.sleep(0.2)  # the host backs off between reconnects
        assert not h3.stale and h3.cpu_pct is not None
    finally:
        host.close()


def test_inference_from_metrics_and_from_log_with_baseline(tmp_path):
    srv = MetricsServer()
    try:
        srv.body = sglang_text(gen_total=1000, prompt_total=0)
        tel = NodeTelemetry(LocalHost(), metrics_url=srv.url, baseline=lambda: Baseline(tokens_per_s=1000.0))
        s = tel.poll_inference()
        assert s.url == srv.url and s.speedup_vs_baseline == pytest.approx(2.87512)
        assert tel.history.get(InferenceSeries.ACCEPT_LEN)[1].tolist() == [3.42]
    finally:
        srv.close()
    down = tel.poll_inference()
    assert down.stale and "no inference server" in down.error and down.accept_len == 3.42

    log = tmp_path / "server.log"
    log.write_text("[2026-09-27 09:21:05 TP0] starting\n")
    s = tel.poll_inference(log_path=str(log))
    assert s.error == f"no metrics lines in {log} yet"
    with open(log, "a") as f:
        f.write("[2026-09-27 09:21:05 TP0] Decode batch, #running-req: 3, token usage: 0.5, accept len: 2.5, gen "
                "throughput (token/s): 1500.0, #queue-req: 0\n")
    s = tel.poll_inference(log_path=str(log))
    assert s.source == "log" and s.gen_tokens_per_s == 1500.0 and s.speedup_vs_baseline == 1.5
    assert NodeTelemetry(LocalHost()).poll_inference().error == "no metrics URL configured for this node"


def test_training_history_uses_step_as_x(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s, "lr": 1e-4, "accept_len": 1 + s / 10}) + "\n"
                         for s in range(1, 6)))
    tel = NodeTelemetry(LocalHost())
    snap = tel.poll_training(str(p), total_steps=10)
    assert snap.step == 5 and snap.total_steps == 10
    xs, ys = tel.history.get(TrainingKey(str(p), "accept_len"))
    assert xs.tolist() == [1, 2, 3, 4, 5] and ys[-1] == 1.5


def test_follow_log_through_the_facade(tmp_path):
    p = tmp_path / "job.log"
    p.write_text("".join(f"{i}\n" for i in range(500)))
    tel = NodeTelemetry(LocalHost())
    assert tel.follow_log(str(p), n=2).lines == ["498", "499"]
    with open(p, "a") as f:
        f.write("500\n")
    assert tel.follow_log(str(p)).new_lines == ["500"]

"""Host telemetry: the /proc + df script (run for real, psutil the oracle), disk fill-rate math."""

from __future__ import annotations

import os

import psutil
import pytest

from ops.hosts.local import LocalHost
from ops.hosts.ssh import SSHHost
from ops.telemetry.hoststats import (
    DiskFillTracker,
    HostStatsCollector,
    host_query_script,
    parse_host_script_output,
)

GB = 10**9


# -- fill rate on synthetic samples ----------------------------------------------------------
def test_fill_rate_and_time_to_full_from_a_steady_writer():
    tr = DiskFillTracker(window_s=600, min_span_s=5)
    total = 1000 * GB
    d = tr.observe("/data", 0.0, total, 500 * GB, 500 * GB)
    assert d.fill_rate_bytes_per_s is None and d.time_to_full_s is None and not d.warn
    for t in range(10, 70, 10):  # 1 GB/s
        used = 500 * GB + t * GB
        d = tr.observe("/data", float(t), total, used, total - used)
    assert d.fill_rate_bytes_per_s == pytest.approx(1 * GB)
    assert d.time_to_full_s == pytest.approx((total - 560 * GB) / GB)
    assert d.warn and "full in" in d.warn_reason  # 440 s < 6 h


def test_slow_fill_does_not_warn_and_freeing_has_no_time_to_full():
    tr = DiskFillTracker()
    total = 10_000 * GB
    for t in range(0, 100, 10):  # 1 MB/s on 5 TB free: about 58 days
        used = 5000 * GB + t * 10**6
        d = tr.observe("/x", float(t), total, used, total - used)
    assert d.fill_rate_bytes_per_s == pytest.approx(10**6)
    assert d.time_to_full_s > 6 * 3600 and not d.warn
    for t in range(100, 200, 10):  # now deleting
        used = 5000 * GB - (t - 100) * GB
        d = tr.observe("/x", float(t), total, used, total - used)
    assert d.fill_rate_bytes_per_s < 0 and d.time_to_full_s is None


def test_low_free_percent_warns_even_without_a_rate():
    d = DiskFillTracker().observe("/", 0.0, 100 * GB, 96 * GB, 4 * GB)
    assert d.warn and d.warn_reason == "only 4.0% free" and d.free_pct == pytest.approx(4.0)


def test_window_forgets_old_samples_and_noise_is_averaged():
    tr = DiskFillTracker(window_s=100, min_span_s=5, smooth_s=0)   # the window alone
    total = 1000 * GB
    for t in range(0, 300, 10):  # 5 GB/s long ago, then 1 GB/s with +-0.5 GB jitter
        used = 100 * GB + 5 * GB * t if t < 100 else 600 * GB + (t - 100) * GB + (GB // 2) * (-1) ** (t // 10)
        d = tr.observe("/d", float(t), total, used, total - used)
    assert d.fill_rate_bytes_per_s == pytest.approx(GB, rel=0.2)


def test_a_checkpoint_burst_does_not_swing_time_to_full_from_days_to_hours():
    """1 MB/s steady on 1 TB free (~12 days), with a 20 GB checkpoint written and deleted every 5 minutes."""
    total, free0 = 2000 * GB, 1000 * GB

    def ttfs(tracker):
        out = []
        for t in range(0, 3 * 3600, 5):
            burst = 20 * GB if t % 300 < 30 else 0
            used = total - free0 + t * 10**6 + burst
            d = tracker.observe("/d", float(t), total, used, total - used)
            if t >= 1800 and d.time_to_full_s is not None:
                out.append(d.time_to_full_s)
        return out

    smoothed = ttfs(DiskFillTracker())
    assert min(smoothed) > 9 * 86400        # never "full in hours" (nor 2 days)
    raw = ttfs(DiskFillTracker(smooth_s=0))
    assert min(raw) < 3 * 86400            # what the unsmoothed slope said


def test_clock_going_back_restarts_the_window():
    tr = DiskFillTracker(min_span_s=1)
    tr.observe("/d", 100.0, 10, 1, 9)
    tr.observe("/d", 110.0, 10, 2, 8)
    d = tr.observe("/d", 50.0, 10, 2, 8)
    assert d.fill_rate_bytes_per_s is None


# -- the script, run by bash on this (real Linux) machine ----------------------------------
def test_script_on_localhost_matches_psutil(tmp_path):
    odd = tmp_path / "dir with 'quotes' and spaces"
    odd.mkdir()
    paths = [str(tmp_path), str(odd), "~", str(tmp_path / "missing")]
    c = HostStatsCollector(LocalHost(), paths)
    s1 = c.read()
    assert s1.cpu_pct is None  # needs a delta
    assert s1.cpu_count == os.cpu_count()
    assert s1.ram_total == psutil.virtual_memory().total
    assert abs(s1.ram_used - (psutil.virtual_memory().total - psutil.virtual_memory().available)) < 512 << 20
    assert s1.load1 == pytest.approx(os.getloadavg()[0], abs=1.0)
    assert [d.path for d in s1.disks] == paths[:3]
    du = psutil.disk_usage(str(tmp_path))
    assert s1.disks[0].total == du.total and abs(s1.disks[0].free - du.free) < 256 << 20
    assert s1.disks[2].total == psutil.disk_usage(os.path.expanduser("~")).total  # ~ means $HOME there
    assert s1.error == f"{tmp_path / 'missing'}: No such file or directory"
    sum(range(200_000))  # a little CPU time between samples
    s2 = c.read()
    assert s2.cpu_pct is not None and 0.0 <= s2.cpu_pct <= 100.0


def test_parse_recorded_proc_output():
    text = (
        "@@nodedeck stat\ncpu  100 0 50 800 50 0 0 0 0 0\n"
        "@@nodedeck loadavg\n12.50 10.25 8.00 3/1200 4242\n"
        "@@nodedeck meminfo\nMemTotal:       2113637788 kB\nMemFree:        100 kB\nMemAvailable:   1900000000 kB\n"
        "@@nodedeck nproc\n224\n"
        "@@nodedeck df /data\nFilesystem          1-blocks          Used     Available Capacity Mounted on\n"
        "/dev/md0  30000000000000 27000000000000 3000000000000      90% /data\n"
        "@@nodedeck df /gone\ndf: /gone: No such file or directory\n"
    )
    raw = parse_host_script_output(text, ["/data", "/gone"])
    assert raw.cpu_times == (150, 1000)  # busy = total - idle - iowait
    assert raw.load == (12.5, 10.25, 8.0) and raw.cpu_count == 224
    assert raw.ram_total == 2113637788 * 1024 and raw.ram_used == (2113637788 - 1900000000) * 1024
    assert raw.disks == [("/data", 30 * 10**12, 27 * 10**12, 3 * 10**12)]
    assert raw.disk_errors == ["/gone: No such file or directory"]


def test_script_is_one_command():
    host = LocalHost()
    calls = []
    orig = host.run
    host.run = lambda argv, **kw: calls.append(argv) or orig(argv, **kw)
    HostStatsCollector(host, ["/", "/tmp"]).read()
    assert len(calls) == 1 and calls[0][:2] == ["bash", "-c"]
    assert calls[0][2] == host_query_script(["/", "/tmp"])


# -- against the real sshd ---------------------------------------------------------------------
def test_host_stats_over_ssh(sshd):
    host = SSHHost("testnode", "testnode", ssh_config=sshd.ssh_config)
    try:
        c = HostStatsCollector(host, [str(sshd.root), "~"])
        s1 = c.read()
        s2 = c.read()
        assert s1.ram_total == psutil.virtual_memory().total  # same machine behind the sshd
        assert s2.cpu_pct is not None and s2.cpu_count == os.cpu_count()
        assert [d.path for d in s2.disks] == [str(sshd.root), "~"] and s2.error is None
        assert s2.disks[0].total == psutil.disk_usage(str(sshd.root)).total
    finally:
        host.close()

"""The resident node-side sampler: same fields as the one-shot commands, falls back and recovers.

Runs the real node script under the real python3, through LocalHost (subprocess pipes: how `local` is read)
and through the real test sshd (an exec channel on the persistent paramiko transport).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import psutil
import pytest

from ops.errors import HostTimeout
from ops.hosts.local import LocalHost
from ops.hosts.ssh import SSHHost
from ops.telemetry import collector
from ops.telemetry.collector import NodeTelemetry
from ops.telemetry.hoststats import HostStatsCollector, raw_from_sample
from ops.telemetry.sampler import NO_PYTHON_RETRY_S, NodeSampler
from ops.telemetry.sampler_node import host_sample
from ops.telemetry.series import GpuKey
from tests.test_telemetry_gpus import fake_smi


class Audit:
    """Every command line sent to a host."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, host: str, line: str) -> None:
        self.lines.append(line)

    def one_shots(self) -> int:
        """Commands that were one-shot queries (bash -c SCRIPT), not sampler starts."""
        return sum(1 for line in self.lines if line.startswith("bash -c"))

    def sampler_starts(self) -> int:
        return sum(1 for line in self.lines if line.startswith("sh -c") and "nodedeck-sampler" in line)


def until(pred, timeout: float = 20.0, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"not true within {timeout}s")


def comparable(snap) -> dict:
    """A host snapshot's fields that two reads a moment apart must agree on exactly."""
    d = dataclasses.asdict(snap)
    return {
        "cpu_count": d["cpu_count"],
        "ram_total": d["ram_total"],
        "error": d["error"],
        "disks": [(x["path"], x["total"]) for x in d["disks"]],
    }


# -- Host.open_process: the stream the sampler runs on ------------------------------------------------
@pytest.fixture(params=["local", "ssh"])
def any_host(request):
    if request.param == "local":
        yield LocalHost()
        return
    sshd = request.getfixturevalue("sshd")
    host = SSHHost("testnode", "testnode", ssh_config=sshd.ssh_config)
    yield host
    host.close()


def test_open_process_streams_lines_both_ways(any_host):
    proc = any_host.open_process(["sh", "-c", "while read -r l; do echo \"got $l\"; done; echo bye >&2"])
    try:
        proc.write(b"one\ntwo\n")
        assert proc.readline(10) == b"got one\n" and proc.readline(10) == b"got two\n"
        with pytest.raises(HostTimeout):
            proc.readline(0.2)  # nothing more was asked
        proc.write(b"three\n")
        assert proc.readline(10) == b"got three\n"
    finally:
        proc.close()
    proc = any_host.open_process(["sh", "-c", "echo last; echo oops >&2; exit 3"])
    try:
        assert proc.readline(10) == b"last\n" and proc.readline(10) == b""
        assert proc.stderr_tail() == "oops"
    finally:
        proc.close()

    proc = any_host.open_process(["printf", "a\\nno newline"])
    try:
        assert proc.readline(10) == b"a\n" and proc.readline(10) == b"no newline" and proc.readline(10) == b""
    finally:
        proc.close()


def test_stderr_of_a_process_closed_under_its_reader_is_never_an_error(any_host):
    """The sampler's reader thread may see the end of output, then ask for stderr after close() ran."""
    proc = any_host.open_process(["sh", "-c", "echo oops >&2; exec sleep 60"])
    proc.close()
    assert proc.stderr_tail() in ("", "oops")


def test_pop_line_takes_whole_lines_and_at_the_end_the_rest():
    from ops.hosts.base import pop_line

    buf = bytearray(b"one\ntwo\nthr")
    assert pop_line(buf) == b"one\n" and pop_line(buf) == b"two\n"
    assert pop_line(buf) is None and buf == b"thr"
    assert pop_line(buf, at_end=True) == b"thr" and buf == b""
    assert pop_line(buf, at_end=True) == b""


# -- field agreement --------------------------------------------------------------------------
def test_node_script_host_sample_matches_the_one_shot_script(tmp_path):
    odd = tmp_path / "dir with 'quotes' and spaces"
    odd.mkdir()
    paths = [str(tmp_path), str(odd), "~", str(tmp_path / "missing")]
    one_shot = HostStatsCollector(LocalHost(), paths).read()
    sampled = HostStatsCollector(LocalHost(), paths).snapshot(raw_from_sample(host_sample(paths)))
    assert comparable(sampled) == comparable(one_shot)
    assert sampled.error == f"{tmp_path / 'missing'}: No such file or directory"
    assert abs(sampled.ram_used - one_shot.ram_used) < 512 << 20
    for a, b in zip(sampled.disks, one_shot.disks):
        assert abs(a.used - b.used) < 256 << 20 and abs(a.free - b.free) < 256 << 20


def test_sampler_on_local_host_serves_host_and_nvidia_smi_gpus(tmp_path):
    smi = fake_smi(tmp_path, "smi_h100_8gpu_gpus.csv", "smi_h100_8gpu_apps.csv")
    audit = Audit()
    host = LocalHost(audit=audit)
    kw = dict(watch_paths=[str(tmp_path), "~"], nvml=False, nvidia_smi=smi)
    sampled = NodeTelemetry(host, **kw)
    one_shot = NodeTelemetry(LocalHost(), sampler_python="no-such-python3", **kw)  # a node without python3
    try:
        sampled.sampler.start()
        g1, g2 = sampled.poll_gpus(), one_shot.poll_gpus()
        assert sampled.sampler.running and audit.one_shots() == 0
        strip = lambda s: {k: v for k, v in dataclasses.asdict(s).items() if k != "ts"}  # noqa: E731
        assert strip(g1) == strip(g2) and g1.available and len(g1.gpus) == 8
        h1, h2 = sampled.poll_host(), one_shot.poll_host()
        assert comparable(h1) == comparable(h2)
        time.sleep(0.05)  # a few clock ticks for the CPU delta
        h1 = sampled.poll_host()
        assert h1.cpu_pct is not None and 0.0 <= h1.cpu_pct <= 100.0
        assert audit.one_shots() == 0 and audit.sampler_starts() == 1
        assert sampled.history.get(GpuKey(0))[1].tolist() == [100.0]
    finally:
        sampled.close()


def test_sampler_over_ssh_agrees_with_the_one_shot_path(sshd):
    audit = Audit()
    host = SSHHost("testnode", "testnode", ssh_config=sshd.ssh_config, audit=audit)
    paths = [str(sshd.root), "~", str(sshd.root / "missing")]
    sampled = NodeTelemetry(host, watch_paths=paths)
    one_shot = NodeTelemetry(host, watch_paths=paths, sampler_python="no-such-python3")  # a node without python3
    try:
        sampled.sampler.start()
        h1, h2 = sampled.poll_host(), one_shot.poll_host()
        assert comparable(h1) == comparable(h2) and h1.error == f"{sshd.root / 'missing'}: No such file or directory"
        assert (h1.load1, h1.load5) == pytest.approx((h2.load1, h2.load5), abs=1.0)
        g1, g2 = sampled.poll_gpus(), one_shot.poll_gpus()
        assert (g1.available, g1.reason, g1.source) == (g2.available, g2.reason, g2.source) == (
            False, "nvidia-smi not found on the node", "nvidia-smi")
        # the two one-shots and the second start (which finds no such python) are one_shot's
        assert audit.one_shots() == 2 and audit.sampler_starts() == 2 and not one_shot.sampler.running
    finally:
        sampled.close()
        host.close()


FAKE_PYNVML = '''
class NVMLError(Exception): pass
class NVMLError_NotSupported(NVMLError): pass
class NVMLError_GpuIsLost(NVMLError): pass
NVML_TEMPERATURE_GPU, NVML_CLOCK_SM = 0, 1
class _U: gpu = 87
class _M: used, total = 40 * 2**30, 80 * 2**30
class _P:
    def __init__(self, pid): self.pid, self.usedGpuMemory = pid, 2**30
def nvmlInit(): pass
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetName(h): return b"NVIDIA H200"
def nvmlDeviceGetUUID(h): return "GPU-%d" % h
def nvmlDeviceGetUtilizationRates(h): return _U()
def nvmlDeviceGetMemoryInfo(h): return _M()
def nvmlDeviceGetTemperature(h, kind): return 55
def nvmlDeviceGetPowerUsage(h):
    if h == 1: raise NVMLError_NotSupported()
    return 350500
def nvmlDeviceGetEnforcedPowerLimit(h): return 700000
def nvmlDeviceGetClockInfo(h, kind):
    if h == 1: raise NVMLError("Unknown Error")
    return 1980
def nvmlDeviceGetComputeRunningProcesses(h): return [_P(PID)] if h == 0 else []
'''


def test_sampler_reads_gpus_through_nvml_when_the_node_can_import_it(tmp_path, monkeypatch):
    """A stand-in pynvml on the node's PYTHONPATH: the NVML branch maps every field, over any python3."""
    (tmp_path / "pynvml.py").write_text(FAKE_PYNVML.replace("PID", str(os.getpid())))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    tel = NodeTelemetry(LocalHost(), sampler_python="python3")
    try:
        tel.sampler.start()
        snap = tel.poll_gpus()
        assert tel.sampler.nvml and snap.source == "nvml" and snap.available and not snap.stale
        g0, g1 = snap.gpus
        assert (g0.name, g0.uuid, g0.util_pct, g0.mem_used_mib,
                g0.mem_total_mib) == ("NVIDIA H200", "GPU-0", 87.0, 40 * 1024, 80 * 1024)
        assert (g0.temp_c, g0.power_w, g0.power_limit_w, g0.sm_clock_mhz,
                g0.error) == (55.0, 350.5, 700.0, 1980.0, None)
        assert g1.power_w is None and g1.sm_clock_mhz is None and g1.error == "ClockInfo: Unknown Error"
        (p,) = snap.processes
        assert p.pid == os.getpid() and p.gpu_index == 0 and p.mem_mib == 1024.0
        assert p.command == " ".join(psutil.Process().cmdline())
    finally:
        tel.close()


def test_streamed_samples_arrive_without_requests(tmp_path):
    s = NodeSampler(LocalHost(), [str(tmp_path)])
    try:
        s.start()
        s.stream(0.05, "h")
        first = until(lambda: s.latest("host"), timeout=10)
        newer = s.wait_newer(first.seq + 2, timeout=10)
        assert newer is not None and newer.seq > first.seq + 2 and newer.host["disks"][0][0] == str(tmp_path)
        s.stream(0)
        r = s.request("h", timeout=5)
        assert r.host is not None and r.seq > newer.seq
    finally:
        s.close()


def test_streaming_polls_read_the_newest_pushed_sample_without_asking(tmp_path):
    audit = Audit()
    tel = NodeTelemetry(LocalHost(audit=audit), timeout=2.0, watch_paths=[str(tmp_path)], stream_interval=1.0)
    try:
        tel.sampler.start()  # streams from the start
        pushed = until(lambda: tel.sampler.latest("host"), timeout=10, step=0.02)
        tel.sampler.wait_newer(pushed.seq, timeout=5)
        os.kill(tel.sampler.pid, signal.SIGSTOP)  # a request now would get no answer
        try:
            started = []
            with pytest.MonkeyPatch.context() as mp:    # a pushed sample is read in the polling thread
                mp.setattr(collector.threading.Thread, "start", lambda th: started.append(th.name))
                h = tel.poll_host()
            assert started == []
            assert not h.stale and tel.sampler.running and audit.one_shots() == 0
            age = time.monotonic() - tel.sampler.latest("host").received
            assert h.ts == pytest.approx(time.time() - age, abs=0.01)
        finally:
            os.kill(tel.sampler.pid, signal.SIGCONT)
    finally:
        tel.close()


# -- failure and recovery ------------------------------------------------------------------------
def test_node_without_python_uses_one_shot_commands_and_does_not_retry_soon(tmp_path):
    audit = Audit()
    tel = NodeTelemetry(LocalHost(audit=audit), sampler_python="no-such-python3", watch_paths=[str(tmp_path)])
    h = tel.poll_host()  # through the one-shot script once the sampler could not start
    assert not h.stale and h.ram_total == psutil.virtual_memory().total
    until(lambda: tel.sampler.reason)
    assert not tel.sampler.running and tel.sampler.reason.endswith("no-such-python3 not found on the node")
    assert tel.sampler._retry_at - time.monotonic() > NO_PYTHON_RETRY_S - 60
    tel.poll_host()
    tel.poll_gpus()
    assert audit.sampler_starts() == 1  # not asked again at every poll


def test_closing_the_local_host_ends_its_sampler():
    """As closing an SSH host's transport ends its channels: a dashboard that closes `local` leaves no sampler."""
    host = LocalHost()
    tel = NodeTelemetry(host)
    tel.sampler.start()
    sampler = psutil.Process(tel.sampler.pid)
    host.close()
    assert not sampler.is_running()
    until(lambda: not tel.sampler.running, timeout=10, step=0.02)


def test_hung_sampler_is_dropped_and_the_poll_answers_through_the_one_shot_command(tmp_path):
    audit = Audit()
    tel = NodeTelemetry(LocalHost(audit=audit), timeout=2.0, watch_paths=[str(tmp_path)])
    try:
        tel.sampler.start()
        assert not tel.poll_host().stale and tel.sampler.running
        os.kill(tel.sampler.pid, signal.SIGSTOP)  # alive but silent, like a wedged node process
        h = tel.poll_host()      # answered by the one-shot command: the silent sampler was given up, not waited on
        assert not h.stale
        assert audit.one_shots() == 1 and "no answer within 1s" in tel.sampler.reason
        assert not tel.sampler.running
    finally:
        tel.close()


def test_node_without_python_over_ssh(sshd):
    host = SSHHost("testnode", "testnode", ssh_config=sshd.ssh_config)
    tel = NodeTelemetry(host, sampler_python="no-such-python3", watch_paths=[str(sshd.root)])
    try:
        assert not tel.poll_host().stale and not tel.poll_gpus().stale
        until(lambda: tel.sampler.reason)
        assert tel.sampler.reason.endswith("no-such-python3 not found on the node")
    finally:
        host.close()


def test_killed_sampler_falls_back_then_restarts(sshd):
    audit = Audit()
    host = SSHHost("testnode", "testnode", ssh_config=sshd.ssh_config, audit=audit)
    tel = NodeTelemetry(host, timeout=15.0, watch_paths=[str(sshd.root)])
    try:
        tel.sampler.start()
        h = tel.poll_host()
        assert not h.stale and tel.sampler.running and audit.one_shots() == 0
        assert "nodedeck-sampler" in " ".join(psutil.Process(tel.sampler.pid).cmdline())
        os.kill(tel.sampler.pid, signal.SIGKILL)
        until(lambda: not tel.sampler.running, timeout=10, step=0.02)
        h2 = tel.poll_host()
        assert not h2.stale and h2.cpu_count == h.cpu_count
        assert audit.one_shots() == 1 and "sampler ended" in tel.sampler.reason
        until(lambda: tel.poll_host() and tel.sampler.running, timeout=20, step=0.2)  # after the backoff
        n = audit.one_shots()
        assert not tel.poll_host().stale and not tel.poll_gpus().stale
        assert audit.one_shots() == n and tel.sampler.starts == 2
    finally:
        tel.close()
        host.close()


def test_sshd_killed_mid_stream_is_stale_then_recovers_on_the_sampler(sshd):
    host = SSHHost("testnode", "testnode", ssh_config=sshd.ssh_config, connect_timeout=10.0)
    tel = NodeTelemetry(host, timeout=15.0, watch_paths=[str(sshd.root)])
    try:
        tel.sampler.start()
        tel.sampler.stream(0.05, "h")
        until(lambda: tel.sampler.latest("host"), timeout=10)
        h = tel.poll_host()
        assert not h.stale and tel.sampler.starts == 1
        host.connect_timeout, tel.timeout = 1.0, 2.0
        sshd.stop()
        h2, g2 = tel.poll_host(), tel.poll_gpus()   # each gives up after its timeout (a hang: pytest-timeout)
        assert h2.stale and h2.error and g2.stale
        host.connect_timeout, tel.timeout = 10.0, 15.0
        sshd.start()
        until(lambda: not tel.poll_host().stale and tel.sampler.running, timeout=40, step=0.2)
        assert tel.sampler.starts == 2 and tel.poll_host().cpu_pct is not None
    finally:
        tel.close()
        host.close()


@pytest.mark.parametrize("parts", ["g", "h", "gh"])
def test_request_over_ssh_answers_each_part(sshd, parts):
    host = SSHHost("testnode", "testnode", ssh_config=sshd.ssh_config)
    s = NodeSampler(host, ["/"])
    try:
        s.start()
        r = s.request(parts, timeout=10)
        assert (r.gpu is not None) == ("g" in parts) and (r.host is not None) == ("h" in parts)
        if r.gpu is not None:
            assert r.gpu["out"] == "@@nodedeck missing\n"  # no nvidia-smi behind the test sshd
    finally:
        s.close()
        host.close()

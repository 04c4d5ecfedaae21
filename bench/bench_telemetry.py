"""Telemetry benchmarks, measured side by side in one run; prints ratio tables.

(a) one GPU+host refresh over the persistent SSH transport vs a fresh `ssh`
    process per query (nvidia-smi is absent here, so the same query script
    reports "unavailable": this measures the transport, which is the point);
(b) the last N lines of a 2 GB log: backwards block reads vs `tail -n N`
    and vs reading the file through (locally and over SSH);
(c) min/max decimation of 1M points vs handing every point to a chart.

Run: .venv/bin/python bench/bench_telemetry.py [--quick]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ops.hosts.base import join_argv  # noqa: E402
from ops.hosts.local import LocalHost  # noqa: E402
from ops.hosts.ssh import SSHHost  # noqa: E402
from ops.telemetry.collector import NodeTelemetry  # noqa: E402
from ops.telemetry.gpus import gpu_query_script  # noqa: E402
from ops.telemetry.history import decimate  # noqa: E402
from ops.telemetry.hoststats import host_query_script  # noqa: E402
from ops.telemetry.tail import FileTail  # noqa: E402
from tests.support.sshd import SSHServer  # noqa: E402


def timed(fn, repeat: int) -> tuple[float, object]:
    """Median seconds of fn over repeat runs, and its last result."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def peak_mem(fn) -> tuple[float, int, object]:
    """(seconds, peak bytes allocated by Python during fn, result)."""
    tracemalloc.start()
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return dt, peak, out


def table(title: str, rows: list[tuple[str, str, str]]) -> None:
    print(f"\n{title}")
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print(f"  {r[0].ljust(w[0])}  {r[1].rjust(w[1])}  {r[2].rjust(w[2])}")


def ms(s: float) -> str:
    return f"{s * 1000:.1f} ms"


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


# -- (a) ------------------------------------------------------------------------------------------
def bench_transport(server: SSHServer, polls: int) -> None:
    host = SSHHost("testnode", "testnode", ssh_config=server.ssh_config)
    tel = NodeTelemetry(host, watch_paths=["/", str(server.root)])
    tel.poll_gpus()
    tel.poll_host()  # connect once, like the dashboard does at start

    def refresh():
        g, h = tel.poll_gpus(), tel.poll_host()
        assert not g.stale and not h.stale, (g.error, h.error)

    scripts = [gpu_query_script(), host_query_script(["/", str(server.root)])]

    def fresh_ssh():
        for script in scripts:
            p = subprocess.run(
                ["ssh", "-F", str(server.ssh_config), "-o", "BatchMode=yes", "testnode", join_argv(["bash", "-c", script])],
                capture_output=True,
            )
            assert p.returncode == 0, p.stderr

    a, b = [], []
    for _ in range(polls):  # interleaved, so load on the machine hits both alike
        a.append(timed(refresh, 1)[0])
        b.append(timed(fresh_ssh, 1)[0])
    host.close()
    persistent, fresh = statistics.median(a), statistics.median(b)
    table(
        f"(a) one GPU+host refresh, median of {polls}",
        [
            ("method", "time", "ratio"),
            ("persistent paramiko transport (NodeTelemetry)", ms(persistent), "1.0x"),
            ("fresh `ssh -F cfg testnode ...` per query", ms(fresh), f"{fresh / persistent:.1f}x slower"),
        ],
    )


# -- (b) ------------------------------------------------------------------------------------------
def make_log(path: Path, size: int) -> None:
    line = b"[2026-09-27 09:21:05 TP0] Decode batch, #running-req: 32, #token: 18432, token usage: 0.09, gen throughput (token/s): 2875.12, #queue-req: 4\n"
    block = line * (1 << 20 // len(line) + 1)
    with open(path, "wb") as f:
        written = 0
        while written < size:
            f.write(block)
            written += len(block)
        f.write(b"the last line\n")


def bench_tail(server: SSHServer, size: int, n: int) -> None:
    path = server.root / "big.log"
    make_log(path, size)
    real = path.stat().st_size

    def ours(host):
        return lambda: FileTail(host, str(path)).seek_tail(n)

    def read_through():
        with open(path, "rb") as f:
            return list(collections.deque(f, maxlen=n))

    t_ours, peak_ours, lines = peak_mem(ours(LocalHost()))
    assert lines[-1] == "the last line" and len(lines) == n
    t_tail, _ = timed(lambda: subprocess.run(["tail", "-n", str(n), str(path)], capture_output=True, check=True), 3)
    t_through, peak_through, through = peak_mem(read_through)
    assert through[-1] == b"the last line\n"
    ssh = SSHHost("testnode", "testnode", ssh_config=server.ssh_config)
    ssh.run(["true"])
    t_remote, remote = timed(ours(ssh), 3)
    assert remote == lines
    t_remote_tail, _ = timed(lambda: ssh.run(["tail", "-n", str(n), str(path)]).check(), 3)
    ssh.close()
    table(
        f"(b) last {n} lines of a {real / 1e9:.1f} GB log",
        [
            ("method", "time", "python peak / ratio"),
            ("FileTail.seek_tail, local", ms(t_ours), f"{mib(peak_ours)}  1.0x"),
            ("`tail -n N` process", ms(t_tail), f"{t_tail / t_ours:.1f}x the time"),
            ("read the file through (deque)", ms(t_through), f"{mib(peak_through)}  {t_through / t_ours:.0f}x the time"),
            ("FileTail.seek_tail over SSH (read_range)", ms(t_remote), f"{t_remote / t_ours:.1f}x local"),
            ("`tail -n N` over the same SSH transport", ms(t_remote_tail), f"{t_remote_tail / t_remote:.1f}x ours over SSH"),
        ],
    )
    path.unlink()


# -- (c) ------------------------------------------------------------------------------------------
def bench_decimate(points: int, width: int) -> None:
    rng = np.random.default_rng(0)
    xs = np.arange(points, dtype=float)
    ys = np.cumsum(rng.normal(0, 1, points))
    t_dec, (dx, dy) = timed(lambda: decimate(xs, ys, width), 5)
    assert dy.max() == ys.max() and dy.min() == ys.min()
    t_all, pts = timed(lambda: list(zip(xs.tolist(), ys.tolist())), 3)  # every point handed to the chart

    def python_minmax():
        step = points / width
        out = []
        for b in range(width):
            seg = pts[int(b * step) : int((b + 1) * step)]
            out.append(min(seg, key=lambda p: p[1]))
            out.append(max(seg, key=lambda p: p[1]))
        return out

    t_py, _ = timed(python_minmax, 3)
    table(
        f"(c) {points:,} points for a {width}-column chart",
        [
            ("method", "time", "points drawn / ratio"),
            ("numpy min/max decimate()", ms(t_dec), f"{len(dx)}  1.0x"),
            ("all points as a list (naive plot)", ms(t_all), f"{len(pts):,}  {t_all / t_dec:.0f}x"),
            ("pure-Python min/max per bucket", ms(t_py), f"{2 * width}  {t_py / t_dec:.0f}x"),
        ],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (200 MB log, fewer polls)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-telemetry-") as tmp:
        server = SSHServer.create(Path(tmp) / "sshd")
        server.start()
        try:
            bench_transport(server, polls=5 if args.quick else 20)
            bench_tail(server, size=(200 if args.quick else 2000) * 10**6, n=200)
        finally:
            server.stop()
    bench_decimate(1_000_000, 200)


if __name__ == "__main__":
    main()

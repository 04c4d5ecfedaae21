"""The decommission download step over a real round-trip time vs `scp -r`, `rsync -a` and `sftp`.

One run, one sshd on 127.0.0.1, one tree; for each RTT a delay proxy (bench/delay_proxy.py: each chunk held
for half the RTT in each direction, no bandwidth limit of its own) sits between every client and the sshd,
and the four tools fetch the same tree through it, side by side:
- nodedeck's whole download step (OpenSSH streams, every byte sha256'd on both ends, fsync, re-listing),
- `scp -r`, `rsync -a` (over ssh) and `sftp -r` (OpenSSH's clients: no checksums, no fsync).
An OpenSSH session channel opens a 2 MiB window (CHAN_SES_WINDOW_DEFAULT), so one channel moves at most
2 MiB per round trip: that bandwidth-delay figure is printed beside what each tool reached. The proxy's own
CPU seconds are printed too (it must not be the bottleneck).

    .venv/bin/python bench/bench_decommission_rtt.py [--mib 1024] [--rtt 0,25,100] [--streams 8]
    .venv/bin/python bench/bench_decommission_rtt.py --ci   # 24 MiB at 0 and 50 ms: seconds; exit 1 below 0.1x scp
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_decommission import make_tree  # noqa: E402
from delay_proxy import DelayProxy  # noqa: E402

from ops.decommission.inputs import Options  # noqa: E402
from ops.decommission.transfer import openssh_argv  # noqa: E402
from ops.decommission.wizard import Decommission  # noqa: E402
from ops.hosts.ssh import SSHHost  # noqa: E402
from tests.support.sshd import SSHServer  # noqa: E402

MiB = 1 << 20
CHANNEL_WINDOW = 2 * MiB  # OpenSSH's CHAN_SES_WINDOW_DEFAULT (64 packets of 32 KiB)
CI_FLOOR = 0.1  # --ci fails only an order of magnitude off the goal (never below 1.0x scp)


@dataclass
class Run:
    tool: str
    wall: float
    proxy_cpu: float


def _alias(server: SSHServer, tmp: Path, port: int, rtt: int) -> Path:
    """An ssh_config naming `testnode` at `port` (the proxy's), its host key known there."""
    pub = (server.root / "ssh_host_ed25519_key.pub").read_text().split()
    known = tmp / f"known_hosts_{rtt}"
    known.write_text(f"[127.0.0.1]:{port} {pub[0]} {pub[1]}\n")
    cfg = tmp / f"ssh_config_{rtt}"
    cfg.write_text(f"Host {SSHServer.alias}\n  HostName 127.0.0.1\n  Port {port}\n  User {server.user}\n"
                   f"  IdentityFile {server.client_key}\n  UserKnownHostsFile {known}\n"
                   "  StrictHostKeyChecking yes\n  BatchMode yes\n")
    return cfg


def _clients(cfg: Path, node: Path, out: Path) -> dict[str, list[str]]:
    remote = f"{SSHServer.alias}:{node}"
    return {
        "scp -r": ["scp", "-q", "-r", "-F", str(cfg), remote, str(out)],
        "rsync -a": ["rsync", "-a", "-e", f"ssh -F {cfg}", f"{remote}/", str(out)],
        "sftp -r": ["sftp", "-q", "-r", "-F", str(cfg), remote, str(out)],
    }


def download_step(cfg: Path, node: Path, dest: Path, streams: int) -> float:
    """The decommission's download step alone (inventory before, untimed); every file must verify."""
    host = SSHHost("bench", SSHServer.alias, ssh_config=cfg)
    try:
        d = Decommission(host, "bench", str(node), Options(dest, streams=streams),
                         ssh_argv=openssh_argv(host.target))
        d.run_inventory()
        d.resolve()
        t0 = time.monotonic()
        d.run_download()
        wall = time.monotonic() - t0
        d.close()
    finally:
        host.close()
    bad = [p for p, fs in d.files.items() if not fs.verified]
    if bad:
        raise SystemExit(f"download step did not verify every file: {bad[:3]}")
    return wall


def measure(proxy: DelayProxy | None, fn) -> tuple[float, float]:
    c0 = proxy.cpu_seconds() if proxy else 0.0
    wall = fn()
    return wall, (proxy.cpu_seconds() - c0) if proxy else 0.0


def one_rtt(server: SSHServer, tmp: Path, node: Path, rtt: int, streams: list[int]) -> list[Run]:
    proxy = DelayProxy(server.port, rtt) if rtt else None
    try:
        cfg = _alias(server, tmp, proxy.port if proxy else server.port, rtt)
        runs = []
        for tool, argv in _clients(cfg, node, tmp / "out").items():
            def client(argv=argv) -> float:
                t0 = time.monotonic()
                subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
                return time.monotonic() - t0
            wall, cpu = measure(proxy, client)
            shutil.rmtree(tmp / "out")
            runs.append(Run(tool, wall, cpu))
        for n in streams:
            wall, cpu = measure(proxy, lambda: download_step(cfg, node, tmp / "dest", n))
            shutil.rmtree(tmp / "dest")
            runs.append(Run(f"nodedeck download step ({n} streams, verified, fsync)", wall, cpu))
        return runs
    finally:
        if proxy:
            proxy.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rtt", default="0,25,100", help="round-trip times in ms, comma separated")
    ap.add_argument("--streams", default=str(Options.streams),
                    help="stream counts of the download step, comma separated (the first is compared)")
    ap.add_argument("--ci", action="store_true", help=f"24 MiB at 0 and 50 ms; exit 1 only below {CI_FLOOR}x scp")
    args = ap.parse_args()
    if args.ci:
        args.mib, args.rtt = 24, "0,50"
    rtts = [int(x) for x in args.rtt.split(",")]
    streams = [int(x) for x in args.streams.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-rtt-"))
    server = SSHServer.create(tmp / "sshd")
    server.start()
    worst = None
    try:
        node = tmp / "node"
        total = make_tree(node, args.mib)
        print(f"tree: {total / MiB:.0f} MiB, sshd on 127.0.0.1 behind a delay proxy, {os.cpu_count()} CPUs",
              flush=True)
        for rtt in rtts:
            runs = one_rtt(server, tmp, node, rtt, streams)
            scp = runs[0].wall
            bdp = (f"one channel's window: {CHANNEL_WINDOW / MiB:.0f} MiB per RTT = "
                   f"{CHANNEL_WINDOW / (rtt / 1000) / MiB:.0f} MiB/s per stream" if rtt else "no window limit at 0 ms")
            print(f"RTT {rtt} ms ({bdp})")
            for r in runs:
                print(f"  {r.tool:<52} {total / r.wall / MiB:7.1f} MiB/s ({r.wall:6.2f} s) x{scp / r.wall:5.2f} "
                      f"vs scp -r; proxy CPU {r.proxy_cpu:5.2f} s")
            ratio = scp / runs[len(_clients(tmp, node, tmp))].wall
            worst = ratio if worst is None else min(worst, ratio)
            print(f"  verified download ({streams[0]} streams) vs scp -r at {rtt} ms: {ratio:.2f}x", flush=True)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    if args.ci and worst is not None and worst < CI_FLOOR:
        raise SystemExit(f"verified download {worst:.2f}x scp -r: an order of magnitude off the goal")


if __name__ == "__main__":
    main()

"""Bulk download of a 1 GiB node tree over a loopback sshd: nodedeck's transfer vs plain `scp -r`.

One run, same sshd, same tree, side by side:
- scp -r (OpenSSH's own client, no checksums, its bytes left in the page cache; for reference, once more
  with nodedeck's cipher order and once followed by `sync -f`, which waits for the disk as the step's fsyncs do),
- nodedeck OpenSSH streams (1 and N streams; sha256 on the node from the read that feeds the stream,
  and locally as the bytes land),
- nodedeck's whole download step (the streams, every byte verified on both ends, + fsync, compare
  and re-stat): the figure that matters, goal >= 1.0x scp.
Prints MiB/s for each and the ratio to scp. The download step runs --rounds times, each between
two `scp -r` runs (scp, step, scp, step, ..., scp), and is compared with the mean of its neighbours;
the median round is reported: on a machine shared with other jobs one round alone swings widely.

    .venv/bin/python bench/bench_decommission.py [--mib 1024] [--streams 4] [--rounds 5]
    .venv/bin/python bench/bench_decommission.py --ci   # 32 MiB, one round, a few seconds; exit 1 only below 0.1x
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

from ops.decommission.inputs import Options  # noqa: E402
from ops.decommission.inventory import Inventory, Root, list_roots  # noqa: E402
from ops.decommission.localtree import DestTree  # noqa: E402
from ops.decommission.transfer import (  # noqa: E402
    FAST_CIPHERS,
    Downloader,
    FileJob,
    OpenSSHStream,
    TransferProgress,
    first_openssh_stream,
    openssh_argv,
)
from ops.decommission.wizard import Decommission  # noqa: E402
from ops.hosts.ssh import SSHHost  # noqa: E402
from tests.support.sshd import SSHServer  # noqa: E402

MiB = 1 << 20
CI_FLOOR = 0.1  # --ci fails only an order of magnitude off the goal (1.0x scp)


def make_tree(root: Path, total_mib: int) -> int:
    """A checkpoint-like mix: half in two big files, a quarter in four, a quarter in 1 MiB files."""
    block = os.urandom(16 * MiB)
    sizes = [total_mib // 4] * 2 + [total_mib // 16] * 4 + [1] * (total_mib // 4)
    written = 0
    for i, mib in enumerate(sizes):
        sub = "checkpoints/step-%d" % (i % 3) if mib > 1 else "data/shards"
        p = root / sub / f"part-{i:04d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "wb") as f:
            left = mib * MiB
            off = (i * 4099) % MiB  # no two files alike
            while left:
                n = min(left, len(block) - off)
                f.write(block[off:off + n])
                left -= n
                off = 0
        written += mib * MiB
    return written


@dataclass
class Took:
    wall: float  # seconds
    cpu: float  # CPU seconds, both ends: this process, its children, and the sshd serving them


class CPUMeter:
    """CPU seconds of this process, its children and the sshd listener's (the node side), reaped or not yet.

    On a machine shared with other jobs the wall-clock swings with their load; the CPU a run costs
    does far less, so it is printed beside the time.
    """

    def __init__(self, sshd_pid: int):
        self.sshd_pid = sshd_pid
        self.staying = set(self._sshd_children())  # connections that stay open (the SSHHost's)

    def _sshd_children(self) -> set[int]:
        out = set()
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
            except OSError:
                continue
            if stat and int(stat[stat.rindex(")") + 2:].split()[1]) == self.sshd_pid:
                out.add(int(entry.name))
        return out

    def total(self) -> float:
        """CPU seconds so far, once the sshd processes of finished connections are reaped (2 s at most)."""
        deadline = time.monotonic() + 2
        while self._sshd_children() - self.staying and time.monotonic() < deadline:
            time.sleep(0.02)
        t = os.times()
        stat = Path(f"/proc/{self.sshd_pid}/stat").read_text()
        utime, stime, cutime, cstime = (int(v) for v in stat[stat.rindex(")") + 2:].split()[11:15])
        return (t.user + t.system + t.children_user + t.children_system
                + (utime + stime + cutime + cstime) / os.sysconf("SC_CLK_TCK"))


def timed(meter: CPUMeter, fn) -> Took:
    c0, t0 = meter.total(), time.monotonic()
    fn()
    wall = time.monotonic() - t0
    return Took(wall, meter.total() - c0)


def scp_r(meter: CPUMeter, server: SSHServer, node: Path, out: Path, *extra: str, durable: bool = False) -> Took:
    """`scp -r` of the node tree into out; `durable`: then `sync -f` (its bytes on the disk, as the step's are)."""
    def run() -> None:
        subprocess.run(["scp", "-q", "-r", *extra, "-F", str(server.ssh_config), f"{SSHServer.alias}:{node}",
                        str(out)], check=True)
        if durable:
            subprocess.run(["sync", "-f", str(out)], check=True)
    took = timed(meter, run)
    shutil.rmtree(out)
    return took


def download_step(meter: CPUMeter, host: SSHHost, node: Path, dest: Path, streams: int,
                  ssh_argv: list[str]) -> Took:
    """One whole download step into a fresh dest; every file must come out verified."""
    d = Decommission(host, "bench", str(node), Options(dest, streams=streams), ssh_argv=ssh_argv)
    d.run_inventory()
    d.resolve()
    took = timed(meter, d.run_download)
    d.close()
    if not all(fs.verified for fs in d.files.values()):
        raise SystemExit("download step did not verify every file")
    shutil.rmtree(dest)
    return took


def streams_only(meter: CPUMeter, inv: Inventory, dest: Path, streams: int, argv: list[str]) -> Took:
    """The Downloader alone (no fsync, no re-listing): sha256 on both ends, in the same pass."""
    tree = DestTree(dest)
    jobs = [FileJob(f.path, f.node_path, f.size, f.mtime_ns, f.mode) for f in inv.files]
    dl = Downloader(lambda: OpenSSHStream(argv), tree, streams)
    took = timed(meter, lambda: dl.run(jobs, TransferProgress(sum(j.size for j in jobs), len(jobs), None)))
    bad = [j.path for j in jobs if j.state != "done" or j.node_sha256 != j.sha256]
    if bad:
        raise SystemExit(f"transfer failed or digests differ: {bad[:3]}")
    tree.close()
    shutil.rmtree(dest)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5,
                    help="download steps, each between two scp -r runs; the ratio is the median round's")
    ap.add_argument("--ci", action="store_true", help=f"small tree (32 MiB), exit 1 only below {CI_FLOOR}x scp")
    args = ap.parse_args()
    if args.ci:
        args.mib, args.rounds = 32, 1
    tmp = Path(tempfile.mkdtemp(prefix="bench-decom-"))
    server = SSHServer.create(tmp / "sshd")
    server.start()
    assert server.proc is not None
    try:
        node = tmp / "node"
        total = make_tree(node, args.mib)
        host = SSHHost("bench", SSHServer.alias, ssh_config=server.ssh_config)
        plain = openssh_argv(host.target)
        first, argv, why = first_openssh_stream(plain)
        if first is None:
            raise SystemExit(f"ssh unusable: {why}")
        first.close()
        inv = list_roots(host, [Root(str(node), "node")])
        meter = CPUMeter(server.proc.pid)
        results: list[tuple[str, Took]] = []

        # scp, step, scp, step, ..., scp: a machine shared with other jobs speeds up and slows down,
        # so each step is compared with the mean of the scp runs on either side of it
        scps = [scp_r(meter, server, node, tmp / "scp")]
        rounds: list[tuple[float, Took, Took]] = []  # (ratio, scp mean, step)
        for i in range(max(1, args.rounds)):
            step = download_step(meter, host, node, tmp / f"full{i}", args.streams, plain)
            scps.append(scp_r(meter, server, node, tmp / "scp"))
            mean = Took((scps[-2].wall + scps[-1].wall) / 2, (scps[-2].cpu + scps[-1].cpu) / 2)
            rounds.append((mean.wall / step.wall, mean, step))
        ratio, scp_mean, step = sorted(rounds, key=lambda r: r[0])[len(rounds) // 2]
        results.append(("scp -r (the mean of the runs either side of the median round's step)", scp_mean))
        if not args.ci:
            results.append(("scp -r, AES-GCM first like nodedeck (for reference)",
                            scp_r(meter, server, node, tmp / "scp", *FAST_CIPHERS)))
            results.append(("scp -r, then `sync -f`: its bytes on the disk too, as the step's are (for reference)",
                            scp_r(meter, server, node, tmp / "scp", durable=True)))
            for streams in sorted({1, args.streams}):
                results.append((f"nodedeck streams={streams} alone (sha256 on both ends, in the same pass)",
                                streams_only(meter, inv, tmp / f"streams{streams}", streams, argv)))
        results.append((f"nodedeck download step, up to {args.streams} streams (every byte verified both ends, "
                        "fsync, re-stat), median round", step))
        host.close()
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    base = results[0][1]
    print(f"tree: {total / MiB:.0f} MiB in {len(inv.files)} files, loopback sshd, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    for name, took in results:
        rate = total / took.wall / MiB
        print(f"  {name:<100} {rate:7.1f} MiB/s ({took.wall:6.2f} s) x{base.wall / took.wall:.2f} vs scp; "
              f"CPU {took.cpu:5.2f} s (x{base.cpu / took.cpu:.2f} vs scp)")
    cpu_ratios = sorted(r[1].cpu / r[2].cpu for r in rounds)
    print(f"verified download vs scp -r: {ratio:.2f}x (goal >= 1.0x; the median of {len(rounds)} rounds: "
          f"{', '.join(f'{r:.2f}' for r, _, _ in rounds)}); CPU of both ends: "
          f"x{cpu_ratios[len(cpu_ratios) // 2]:.2f} (scp's CPU seconds over nodedeck's, median round)")
    if args.ci and ratio < CI_FLOOR:
        raise SystemExit(f"verified download {ratio:.2f}x scp: an order of magnitude off the goal")


if __name__ == "__main__":
    main()

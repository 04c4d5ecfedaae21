"""Bulk download of a 1 GiB node tree over a loopback sshd: nodedeck's transfer vs plain `scp -r`.

One run, same sshd, same tree, side by side:
- scp -r (OpenSSH's own client, no checksums; once more with nodedeck's cipher order, for reference),
- nodedeck OpenSSH streams (1 and N streams; bytes hashed with sha256 as they land),
- nodedeck's whole download step (streams + sha256 of every file on the node, pipelined, + fsync,
  compare and re-stat).
Prints MiB/s for each and the ratio to scp.

    .venv/bin/python bench/bench_decommission.py [--mib 1024] [--streams 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ops.decommission.inventory import Root, list_roots  # noqa: E402
from ops.decommission.transfer import (  # noqa: E402
    FAST_CIPHERS,
    Downloader,
    FileJob,
    OpenSSHStream,
    Progress,
    local_path,
    openssh_argv,
    part_path,
    usable_openssh,
)
from ops.decommission.wizard import Decommission, Options  # noqa: E402
from ops.hosts.ssh import SSHHost  # noqa: E402
from tests.support.sshd import SSHServer  # noqa: E402

MiB = 1 << 20


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


def timed(fn) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--streams", type=int, default=4)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-decom-"))
    server = SSHServer.create(tmp / "sshd")
    server.start()
    try:
        node = tmp / "node"
        total = make_tree(node, args.mib)
        host = SSHHost("bench", SSHServer.alias, ssh_config=server.ssh_config)
        argv, why = usable_openssh(openssh_argv(host.target, server.ssh_config))
        if argv is None:
            raise SystemExit(f"ssh unusable: {why}")
        inv = list_roots(host, [Root(str(node), "node")])
        results: list[tuple[str, float]] = []

        out = tmp / "scp"
        results.append(("scp -r", timed(lambda: subprocess.run(
            ["scp", "-q", "-r", "-F", str(server.ssh_config), f"{SSHServer.alias}:{node}", str(out)], check=True))))
        shutil.rmtree(out)
        results.append(("scp -r, AES-GCM first like nodedeck (for reference)", timed(lambda: subprocess.run(
            ["scp", "-q", "-r", *FAST_CIPHERS, "-F", str(server.ssh_config), f"{SSHServer.alias}:{node}", str(out)],
            check=True))))
        shutil.rmtree(out)

        for streams in sorted({1, args.streams}):
            dest = tmp / f"streams{streams}"
            jobs = [FileJob(f.path, f.node_path, f.size, f.mtime_ns, f.mode, local_path(dest, f.path),
                            part_path(dest, f.path)) for f in inv.files]
            progress = Progress(total, len(jobs), None)
            dl = Downloader(lambda: OpenSSHStream(argv), streams)
            results.append((f"nodedeck streams={streams} (local sha256 as it lands)",
                            timed(lambda: dl.run(jobs, progress))))
            bad = [j.path for j in jobs if j.state != "done"]
            if bad:
                raise SystemExit(f"transfer failed: {bad[:3]}")
            shutil.rmtree(dest)

        d = Decommission(host, "bench", str(node), Options(tmp / "full", streams=args.streams), ssh_argv=argv)
        d.run_inventory()
        d.resolve()
        results.append((f"nodedeck download step, streams={args.streams} (+ node sha256, fsync, compare, re-stat)",
                        timed(d.run_download)))
        if not all(fs.verified for fs in d.files.values()):
            raise SystemExit("download step did not verify every file")
        host.close()
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    scp_rate = total / results[0][1] / MiB
    print(f"tree: {total / MiB:.0f} MiB in {len(inv.files)} files, loopback sshd, {os.cpu_count()} CPUs")
    for name, secs in results:
        rate = total / secs / MiB
        print(f"  {name:<78} {rate:8.1f} MiB/s  ({secs:6.2f} s)  x{rate / scp_rate:.2f} vs scp")


if __name__ == "__main__":
    main()

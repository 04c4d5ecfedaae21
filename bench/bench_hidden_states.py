"""Hidden-state write throughput vs a sequential `dd` write to the same disk, measured side by side.

1. writer: the real shard writer (`write_shard`: safetensors in large aligned O_DIRECT writes
   straight from the shard's buffer, fsync, rename) on shards packed by `shard_tensors` from
   precomputed float32 tensors (packing is the compute thread's step, timed and printed apart);
   also the same writer through the page cache (`direct=False`, the fallback), for comparison;
2. end to end: `extract_to_dir` with the tiny target model (model compute included);
3. dd: `dd if=/dev/zero of=F bs=1M count=N oflag=direct` (conv=fdatasync where O_DIRECT is refused);
4. capture scaling: the same capture under `torchrun --nproc-per-node 1` and `2` (CPU ranks, gloo) on
   the tiny target; throughput from each rank's own compute time (process start-up left out), so the
   ratio is the data-parallel speed-up (at most 2.0, and only where two cores are free).
Prints MB/s for each and the ratios to dd (goal: writer >= 0.8x dd).

`--ci`: a few seconds (32 MiB, no end-to-end run); exits 1 only when the writer is below 0.08x dd,
an order of magnitude off the goal, so it catches regressions without flakiness.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.hidden_states.extract import extract_to_dir  # noqa: E402
from trainer.hidden_states.shards import shard_tensors, write_shard  # noqa: E402
from trainer.tiny import build_tiny_target  # noqa: E402
from trainer.tokenized import TokenizedSample  # noqa: E402


def bench_writer(out: Path, *, samples: int, tokens: int, hidden: int, num_aux: int, shard_samples: int,
                 direct: bool = True) -> tuple[int, float, float]:
    """(bytes, seconds in write_shard, seconds in shard_tensors): the pipeline packs a shard on the
    compute thread while the writer thread writes the previous one, so the two are timed apart."""
    g = torch.Generator().manual_seed(0)
    aux = [torch.randn(tokens, num_aux * hidden, generator=g) for _ in range(shard_samples)]  # float32, as computed
    last = [torch.randn(tokens, hidden, generator=g) for _ in range(shard_samples)]
    rows = [TokenizedSample(f"s{i}", list(range(tokens)), [1] * tokens, i + 1) for i in range(shard_samples)]
    written, write_s, pack_s = 0, 0.0, 0.0
    for n in range(samples // shard_samples):
        t0 = time.perf_counter()
        shard = shard_tensors(rows, aux, last, torch.bfloat16)
        t1 = time.perf_counter()
        written += write_shard(out / f"shard-{n:05d}.safetensors", shard, direct=direct)
        pack_s, write_s = pack_s + t1 - t0, write_s + time.perf_counter() - t1
    return written, write_s, pack_s


def bench_end_to_end(work: Path, *, samples: int, tokens: int) -> tuple[int, float]:
    model = build_tiny_target(work / "tiny", hidden_size=256, num_layers=8)
    rng = random.Random(0)
    with (work / "tok.jsonl").open("w") as f:
        for i in range(samples):
            f.write(json.dumps({"id": f"s{i}", "input_ids": [rng.randrange(700) for _ in range(tokens)],
                                "loss_mask": [1] * tokens}) + "\n")
    t0 = time.perf_counter()
    meta = extract_to_dir(model, work / "tok.jsonl", work / "hs", shard_samples=16, batch_size=8, log=lambda m: None)
    elapsed = time.perf_counter() - t0
    return sum((work / "hs" / s["file"]).stat().st_size for s in meta["shards"]), elapsed


def bench_scaling(work: Path, *, samples: int, tokens: int) -> dict[int, float]:
    """Samples/s of `nodedeck-train hidden-states` under torchrun with 1 and 2 CPU ranks."""
    model = build_tiny_target(work / "tiny-scaling", hidden_size=256, num_layers=8)
    rng = random.Random(1)
    with (work / "scaling.jsonl").open("w") as f:
        for i in range(samples):
            f.write(json.dumps({"id": f"s{i}", "input_ids": [rng.randrange(700) for _ in range(tokens)],
                                "loss_mask": [1] * tokens}) + "\n")
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(repo), OMP_NUM_THREADS="1")
    rates = {}
    for ranks in (1, 2):
        proc = subprocess.run([str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node",
                               str(ranks), "-m", "trainer.cli", "hidden-states", "--model", str(model), "--data",
                               str(work / "scaling.jsonl"), "--out", str(work / f"scaling-{ranks}"), "--device", "cpu",
                               "--shard-samples", "8", "--batch-size", "8"], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"torchrun with {ranks} rank(s) failed: {proc.stderr.strip()[-2000:]}")
        seconds = [float(m) for m in re.findall(r"samples in ([0-9.]+) s\)", proc.stderr)]
        if len(seconds) != ranks:
            raise SystemExit(f"expected {ranks} timing lines from the ranks, got: {proc.stderr.strip()[-2000:]}")
        rates[ranks] = samples / max(seconds)  # the slowest rank ends the capture
    return rates


def bench_dd(path: Path, mib: int) -> tuple[int, float, str]:
    for flag in ("oflag=direct", "conv=fdatasync"):
        t0 = time.perf_counter()
        proc = subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", flag],
                              capture_output=True, text=True)
        elapsed = time.perf_counter() - t0
        if proc.returncode == 0:
            return mib * 2**20, elapsed, flag
    raise SystemExit(f"dd failed: {proc.stderr.strip()}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", help="directory on the disk to measure (default: a temp dir here)")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--e2e-samples", type=int, default=64)
    p.add_argument("--scaling-samples", type=int, default=64, help="capture scaling: samples (0: skip)")
    p.add_argument("--rounds", type=int, default=3, help="dd/writer/dd rounds; the ratios are their median")
    p.add_argument("--ci", action="store_true", help="small and quick; fail only below 0.08x dd")
    args = p.parse_args()
    if args.ci:
        args.samples, args.tokens, args.hidden, args.e2e_samples, args.scaling_samples = 32, 256, 1024, 0, 0
        args.rounds = 1
    work = Path(tempfile.mkdtemp(prefix="bench-hs-", dir=args.dir or "."))
    shape = dict(samples=args.samples, tokens=args.tokens, hidden=args.hidden, num_aux=3, shard_samples=16)
    try:
        (work / "w").mkdir()
        (work / "p").mkdir()
        # rounds of dd, the writer, the page-cache writer, dd again: a disk that speeds up or slows
        # down (other jobs on it) shows as different dd figures; each round's ratios use the mean of
        # its two dd runs, and the median round is reported
        rounds = []
        for _ in range(max(1, args.rounds)):
            d_bytes, d1_s, flag = bench_dd(work / "dd.bin",
                                           max(1, args.samples * args.tokens * args.hidden * 8 // 2**20))
            w_bytes, w_s, pack_s = bench_writer(work / "w", **shape)
            p_bytes, p_s, _ = bench_writer(work / "p", **shape, direct=False)
            _, d2_s, _ = bench_dd(work / "dd.bin", d_bytes // 2**20)
            rounds.append((w_bytes / w_s / (2 * d_bytes / (d1_s + d2_s)), (d1_s, w_s, p_s, d2_s, pack_s)))
        rounds.sort(key=lambda r: r[0])
        d1_s, w_s, p_s, d2_s, pack_s = rounds[len(rounds) // 2][1]
        e_bytes, e_s = bench_end_to_end(work, samples=args.e2e_samples,
                                        tokens=args.tokens) if args.e2e_samples else (0, 0)
        scaling = bench_scaling(work, samples=args.scaling_samples, tokens=256) if args.scaling_samples else {}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rate = lambda b, s: b / s / 1e6  # noqa: E731
    dd = rate(2 * d_bytes, d1_s + d2_s)
    print(f"dd ({flag})          : {d_bytes / 2**20:8.1f} MiB twice, {d1_s:6.2f} s and {d2_s:6.2f} s = {dd:8.1f} MB/s")
    print(f"shard writer         : {w_bytes / 2**20:8.1f} MiB in {w_s:6.2f} s = {rate(w_bytes, w_s):8.1f} MB/s")
    print(f"  via the page cache : {p_bytes / 2**20:8.1f} MiB in {p_s:6.2f} s = {rate(p_bytes, p_s):8.1f} MB/s")
    print(f"packing f32 -> bf16  : {w_bytes / 2**20:8.1f} MiB in {pack_s:6.2f} s = {rate(w_bytes, pack_s):8.1f} MB/s"
          " (compute thread, overlapped with the writer)")
    if e_bytes:
        print(f"end to end (tiny H256): {e_bytes / 2**20:8.1f} MiB in {e_s:6.2f} s = {rate(e_bytes, e_s):8.1f} MB/s")
    ratio = rate(w_bytes, w_s) / dd
    print(f"ratio writer/dd      : {ratio:.2f}  (goal >= 0.80; the median of {len(rounds)} rounds: "
          f"{', '.join(f'{r:.2f}' for r, _ in rounds)})")
    print(f"ratio page-cache/dd  : {rate(p_bytes, p_s) / dd:.2f}")
    if e_bytes:
        print(f"ratio end-to-end/dd  : {rate(e_bytes, e_s) / dd:.2f}")
    if scaling:
        print(f"capture, 1 CPU rank  : {scaling[1]:8.2f} samples/s")
        print(f"capture, 2 CPU ranks : {scaling[2]:8.2f} samples/s")
        print(f"ratio 2 ranks/1 rank : {scaling[2] / scaling[1]:.2f}  (ideal 2.00)")
    if args.ci and ratio < 0.08:
        print("FAIL: the shard writer is more than 10x below dd")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

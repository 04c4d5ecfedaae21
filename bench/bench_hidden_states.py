"""Hidden-state write throughput vs a sequential `dd` write to the same disk, measured side by side.

1. writer: the real shard writer (`shard_tensors` + `write_shard`: safetensors, fsync, rename) on
   precomputed bf16 tensors, so the model is not the bottleneck;
2. end to end: `extract_to_dir` with the tiny target model (model compute included);
3. dd: `dd if=/dev/zero of=F bs=1M count=N oflag=direct` (conv=fdatasync where O_DIRECT is refused).
Prints MB/s for each and the ratios to dd.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.hidden_states import extract_to_dir, shard_tensors, write_shard  # noqa: E402
from trainer.tiny import build_tiny_target  # noqa: E402
from trainer.tokenized import TokenizedSample  # noqa: E402


def bench_writer(out: Path, *, samples: int, tokens: int, hidden: int, num_aux: int, shard_samples: int) -> tuple[int, float]:
    g = torch.Generator().manual_seed(0)
    aux = [torch.randn(tokens, num_aux * hidden, generator=g).to(torch.bfloat16) for _ in range(shard_samples)]
    last = [torch.randn(tokens, hidden, generator=g).to(torch.bfloat16) for _ in range(shard_samples)]
    rows = [TokenizedSample(f"s{i}", list(range(tokens)), [1] * tokens, i + 1) for i in range(shard_samples)]
    written, t0 = 0, time.perf_counter()
    for n in range(samples // shard_samples):
        written += write_shard(out / f"shard-{n:05d}.safetensors", shard_tensors(rows, aux, last, torch.bfloat16))
    return written, time.perf_counter() - t0


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
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-hs-", dir=args.dir or "."))
    try:
        (work / "w").mkdir()
        w_bytes, w_s = bench_writer(work / "w", samples=args.samples, tokens=args.tokens, hidden=args.hidden,
                                    num_aux=3, shard_samples=16)
        d_bytes, d_s, flag = bench_dd(work / "dd.bin", max(1, w_bytes // 2**20))
        e_bytes, e_s = bench_end_to_end(work, samples=args.e2e_samples, tokens=args.tokens)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rate = lambda b, s: b / s / 1e6  # noqa: E731
    print(f"dd ({flag})          : {d_bytes / 2**20:8.1f} MiB in {d_s:6.2f} s = {rate(d_bytes, d_s):8.1f} MB/s")
    print(f"shard writer         : {w_bytes / 2**20:8.1f} MiB in {w_s:6.2f} s = {rate(w_bytes, w_s):8.1f} MB/s")
    print(f"end to end (tiny H256): {e_bytes / 2**20:8.1f} MiB in {e_s:6.2f} s = {rate(e_bytes, e_s):8.1f} MB/s")
    print(f"ratio writer/dd      : {rate(w_bytes, w_s) / rate(d_bytes, d_s):.2f}")
    print(f"ratio end-to-end/dd  : {rate(e_bytes, e_s) / rate(d_bytes, d_s):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

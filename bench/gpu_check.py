"""`make gpu-check`: what a CUDA GPU machine can prove about the trainer, one line per check.

Runs with the python3 already on the machine (torch, transformers, safetensors, tokenizers, pytest;
nvidia-ml-py for the NVML checks): no venv is made and nothing is downloaded. Prints
`PASS name detail`, `FAIL name detail` or `SKIP name reason` per check and exits 1 on any FAIL.
Without CUDA every GPU check is a SKIP (the script itself still runs: `make gpu-check` on CPU).

Checks:
  gpu-test::<test>      each test of tests/test_trainer_gpu.py (marker `gpu`): bf16 training of EAGLE-3
                        and DFlash on CUDA, a NaN step skipped on the device, DFlash's masked SDPA
                        backward finite in bf16 on the pinned backend, the target loaded onto the GPU
  train-eagle3-bf16     bench/bench_training.py --device cuda: steps/s, tokens/s and MFU of the real
  train-dflash-bf16     training step (drafter FLOPs only), at a realistic hidden size
  train-vs-specforge    the same run's EAGLE-3 step against SpecForge 0.2.0's own model on identical weights
                        and data: steps/s and peak memory side by side; passes at SpecForge's speed or
                        better with no more memory (issue 43's goal), fails with both ratios otherwise
  nvml-node-sampler     ops/telemetry/sampler_node.py (what the dashboard streams to a node) reports
                        this machine's GPUs through NVML
  nvml-gpu-panel        the GPU panel's reading of `local` (the sampler started by ops.telemetry.sampler,
                        its sample parsed into the panel's snapshot) has them through NVML

    python3 bench/gpu_check.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
results: list[tuple[str, str, str]] = []


def report(status: str, name: str, detail: str) -> None:
    detail = " ".join(str(detail).split())[:300]
    results.append((status, name, detail))
    print(f"{status} {name} {detail}", flush=True)


def env() -> dict:
    e = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.pop("CUDA_LAUNCH_BLOCKING", None)
    return e


def gpu_tests(timeout: float, cuda: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "--noconftest", "-p", "no:cacheprovider", "-m", "gpu",
               "-o", "addopts=", f"--junitxml={xml}", str(REPO / "tests" / "test_trainer_gpu.py")]
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            report("FAIL", "gpu-tests", f"pytest did not finish in {timeout:.0f} s")
            return
        if not xml.exists():
            report("FAIL", "gpu-tests", f"pytest exited {proc.returncode}: {(proc.stdout + proc.stderr)[-300:]}")
            return
        cases = list(ET.parse(xml).getroot().iter("testcase"))
        if not cases:
            report("FAIL", "gpu-tests", f"no test ran (pytest exit {proc.returncode}): {proc.stdout[-200:]}")
        for case in cases:
            name = f"gpu-test::{case.get('name')}"
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            skipped = case.find("skipped")
            took = f"{float(case.get('time', 0)):.1f}s"
            if bad is not None:
                report("FAIL", name, f"{took} {bad.get('message', '')}")
            elif skipped is not None:
                report("FAIL" if cuda else "SKIP", name,
                       f"skipped{' on a CUDA machine' if cuda else ''}: {skipped.get('message', '')}")
            else:
                report("PASS", name, took)


def training_bench(quick: bool, timeout: float) -> None:
    sizes = ["--hidden", "1024", "--layers", "4", "--vocab", "32000", "--seq", "1024", "--batch", "2",
             "--steps", "5"] if quick else \
        ["--hidden", "2048", "--layers", "4", "--vocab", "32000", "--seq", "2048", "--batch", "2", "--steps", "8"]
    cmd = [sys.executable, str(REPO / "bench" / "bench_training.py"), "--device", "cuda", *sizes]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        for name in ("train-eagle3-bf16", "train-dflash-bf16", "train-vs-specforge"):
            report("FAIL", name, f"bench_training.py did not finish in {timeout:.0f} s")
        return
    out = proc.stdout
    rows = {line.split()[0] + " " + line.split()[1]: line for line in out.splitlines()
            if line.startswith(("eagle3 ttt=7", "dflash b=16"))}
    device = next((line for line in out.splitlines() if line.startswith("device:")), "")
    for name, key in (("train-eagle3-bf16", "eagle3 ttt=7"), ("train-dflash-bf16", "dflash b=16")):
        if proc.returncode != 0 or key not in rows:
            report("FAIL", name, f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-300:]}")
            continue
        cells = rows[key].split()
        # run steps/s tokens/s GFLOP/step GFLOP/s MFU
        report("PASS", name, f"{cells[2]} steps/s {cells[3]} tokens/s {cells[5]} GFLOP/s MFU {cells[6]} "
                             f"({' '.join(sizes[:10])}; {device}; {time.monotonic() - t0:.0f}s)")
    versus_specforge(out, proc.returncode)


def versus_specforge(out: str, returncode: int) -> None:
    """The train-vs-specforge check from bench_training.py's two comparison lines."""
    speed = re.search(r"model step, float32: nodedeck ([\d.]+) steps/s, SpecForge ([\d.]+) steps/s", out)
    memory = re.search(r"peak memory above resident: nodedeck (\d+) MiB, SpecForge (\d+) MiB", out)
    skipped = re.search(r"SpecForge comparison skipped: (.*)", out)
    if skipped:
        report("SKIP", "train-vs-specforge", skipped.group(1))
        return
    if speed is None or memory is None:
        report("FAIL", "train-vs-specforge", f"no comparison printed (exit {returncode}): {out[-200:]}")
        return
    ours, theirs = float(speed.group(1)), float(speed.group(2))
    ours_mib, theirs_mib = int(memory.group(1)), int(memory.group(2))
    speed_x, memory_x = ours / theirs, ours_mib / max(theirs_mib, 1)
    report("PASS" if speed_x >= 1.0 and memory_x <= 1.0 else "FAIL", "train-vs-specforge",
           f"nodedeck {ours:.2f} steps/s {ours_mib} MiB, SpecForge {theirs:.2f} steps/s {theirs_mib} MiB: "
           f"speed {speed_x:.2f}x (goal >= 1.0), memory {memory_x:.2f}x (goal <= 1.0)")


def nvml_node_sampler() -> None:
    script = REPO / "ops" / "telemetry" / "sampler_node.py"
    try:
        proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(json.dumps({"paths": ["/"], "gpu_script": "true", "nvml": True}) + "\ng\n",
                                    timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        report("FAIL", "nvml-node-sampler", f"{type(exc).__name__}: {exc}")
        return
    lines = [json.loads(x) for x in out.splitlines() if x.strip()]
    hello = lines[0] if lines else {}
    sample = next((x for x in lines[1:] if "gpu" in x), {})
    gpus = (sample.get("gpu") or {}).get("gpus") or []
    if not hello.get("nvml") or (sample.get("gpu") or {}).get("source") != "nvml" or not gpus:
        report("FAIL", "nvml-node-sampler", f"hello {hello}; gpu {str(sample.get('gpu'))[:150]}; {err[-150:]}")
        return
    first = gpus[0]
    report("PASS", "nvml-node-sampler", f"{len(gpus)} GPU(s) through NVML, first {json.dumps(first)[:200]}")


def nvml_gpu_panel() -> None:
    sys.path.insert(0, str(REPO))
    try:
        from ops.hosts.local import LocalHost
        from ops.telemetry.sampler import NodeSampler, gpu_snapshot
    except ImportError as exc:
        report("SKIP", "nvml-gpu-panel", f"ops.telemetry.sampler does not import here ({exc})")
        return
    sampler = NodeSampler(LocalHost(), python=sys.executable)   # as NodeTelemetry reads `local`
    try:
        sample = sampler.request("g", timeout=60)
        snap = gpu_snapshot(sample.gpu, sample.t)
    except Exception as exc:  # a sampler that does not start or answer, a sample that does not parse: the finding
        report("FAIL", "nvml-gpu-panel", f"{type(exc).__name__}: {exc}")
        return
    finally:
        sampler.close()
    if not snap.available or not snap.gpus or snap.source != "nvml":
        report("FAIL", "nvml-gpu-panel", f"no GPUs through NVML in the panel's sample (source {snap.source!r}: "
                                         f"{snap.reason}; sampler: nvml {sampler.nvml})")
        return
    g = snap.gpus[0]
    report("PASS", "nvml-gpu-panel", f"{len(snap.gpus)} GPU(s) via {snap.source}: {g.name} util {g.util_pct}% "
                                     f"mem {g.mem_used_mib}/{g.mem_total_mib} MiB power {g.power_w} W "
                                     f"{g.temp_c} C, {len(snap.processes)} processes")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller training benchmark (a couple of minutes less)")
    a = p.parse_args()
    try:
        import torch
    except ImportError as exc:
        report("FAIL", "torch", f"does not import: {exc}")
        return 1
    cuda = torch.cuda.is_available()
    name = torch.cuda.get_device_name(0) if cuda else "none"
    print(f"INFO python {sys.version.split()[0]} torch {torch.__version__} cuda {torch.version.cuda} "
          f"device {name}", flush=True)
    t0 = time.monotonic()
    gpu_tests(timeout=200, cuda=cuda)  # on CPU too: the tests must collect without the suite's conftest
    if cuda:
        training_bench(a.quick, timeout=240)
        nvml_node_sampler()
        nvml_gpu_panel()
    else:
        for check in ("train-eagle3-bf16", "train-dflash-bf16", "train-vs-specforge", "nvml-node-sampler",
                      "nvml-gpu-panel"):
            report("SKIP", check, "no CUDA GPU on this machine")
    failed = [n for s, n, _ in results if s == "FAIL"]
    print(f"gpu-check: {sum(s == 'PASS' for s, _, _ in results)} passed, {len(failed)} failed, "
          f"{sum(s == 'SKIP' for s, _, _ in results)} skipped in {time.monotonic() - t0:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

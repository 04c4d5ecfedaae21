"""The engine tier: real vLLM serving the demo pipeline's target and drafters (`make test-engines`)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.engines.vllm_server import vllm_python

BIN = Path(sys.executable).parent

# `make test` runs this tier on two workers, one group of modules each (--dist loadgroup), split so that neither
# waits long for the other at the end (CI, 2026-12-07): the DFlash drafter's training and server (227 s), the EAGLE-3
# server (76 s) and the flag table (32 s) on one; the demo on vLLM (145 s), the train-serve verdicts (107 s) and the
# plan (66 s) on the other. (Three workers took 474 s, not 359: the DFlash training and the servers share 2 cores.)
FIRST_HALF = {"test_vllm_dflash", "test_vllm_eagle3", "test_vllm_flags"}


@pytest.hookimpl(tryfirst=True)   # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    for item in items:
        module = item.path.stem
        if item.path.parent.name == "engines" and module.startswith("test_"):
            item.add_marker(pytest.mark.xdist_group("engines-1" if module in FIRST_HALF else "engines-2"))


@dataclass(frozen=True)
class Demo:
    """What the demo pipeline made: the target, its EAGLE-3 export, the tokenized data, the eval's result."""

    work: Path
    target: Path
    eagle3: Path
    tokenized: Path
    hidden: Path
    eval_json: Path


@pytest.fixture(scope="session")
def vllm_py() -> Path:
    py = vllm_python()
    if py is None:
        pytest.skip("no vLLM: `make .venv-vllm/.installed` (or set NODEDECK_VLLM_PYTHON)")
    return py


@pytest.fixture(scope="session")
def demo(tmp_path_factory, vllm_py) -> Demo:
    """The headless demo's outputs ($NODEDECK_DEMO_WORK when it holds a verified demo, else a fresh run)."""
    work = Path(os.environ.get("NODEDECK_DEMO_WORK") or tmp_path_factory.mktemp("demo-work"))
    d = work / "demo"
    want = [d / "model" / "config.json", d / "drafter" / "final" / "config.json", d / "eval.json",
            d / "data" / "tokenized.jsonl", d / "hidden" / "index.json"]
    work.parent.mkdir(parents=True, exist_ok=True)
    with open(work.parent / f".{work.name}.lock", "w") as lock:   # each xdist worker asks: one runs it, the rest wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all(p.exists() for p in want):
            r = subprocess.run([str(BIN / "nodedeck"), "demo", "--headless", "--engine", "standin", "--work",
                                str(work)], capture_output=True, text=True, timeout=1500, check=False)
            assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return Demo(work, d / "model", d / "drafter" / "final", d / "data" / "tokenized.jsonl", d / "hidden",
                d / "eval.json")

"""PROGRESS.md, manifest.json and system-info.json of two wizard runs, byte for byte against recorded copies.

The copies (tests/data/decommission_notes/) were written by the wizard before its notes were rendered from
the frozen `DecommissionResult`: they hold the output that rendering must keep. The clock is fixed, the system
information is a recorded capture, and the test's temporary directory reads `<TMP>`. The order of `dirs` and
`links` in the manifest is the node's listing order (the file system's), so the recorded copy is put into the
run's order before the bytes are compared.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ops.decommission.inputs import StageStates
from ops.decommission.sysinfo import Section, SystemInfo
from ops.state import StageStateRow
from tests.support.decommission_tree import MiB, make_tree, node_and_bucket, store_mixed

DATA = Path(__file__).parent / "data" / "decommission_notes"
NOW = 1_700_000_123.0
RECORD = os.environ.get("NODEDECK_RECORD_NOTES") == "1"  # write the copies instead of comparing

SECTIONS = {
    "gpu_query": "0, NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15, 00000000:18:00.0\n"
                 "1, NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15, 00000000:2A:00.0",
    "nvidia_smi": "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |",
    "nvcc": "Cuda compilation tools, release 12.4, V12.4.131",
    "cpu": "Architecture:        x86_64\nCPU(s):              208\nModel name:          Intel(R) Xeon(R) "
           "Platinum 8480+ | fast",
    "memory": "MemTotal:       2113451724 kB\nMemFree:        1000 kB",
    "disks": "Filesystem 1-blocks Used Available Capacity Mounted on\n"
             "/dev/nvme0n1p1 1000000000000 250000000000 750000000000 25% /\n"
             "/dev/md0 8000000000000 1000 7999999999000 1% /mnt/data disk",
    "os": 'NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"',
    "kernel": "Linux gpu-7 5.15.0-105-generic #115-Ubuntu SMP x86_64 GNU/Linux",
    "python": "Python 3.11.9",
    "pip": "torch==2.4.0\nnumpy==1.26.4\n\n",
    "tmux": "train: 1 windows (created Tue)\nserve: 2 windows",
}


def _captured(host, python="python3", timeout=0.0) -> SystemInfo:
    """A recorded capture: every section but `processes` (which says it is missing), one failed."""
    info = SystemInfo(host.name, time.time())
    for name, out in SECTIONS.items():
        info.sections[name] = Section(name, f"title of {name}", f"command of {name}", 0, out)
    info.sections["gpu"] = Section("gpu", "GPUs (nvidia-smi -q)", "nvidia-smi -q", 127, "nvidia-smi: not found")
    info.error = "only 12 of 13 sections came back"
    return info


@pytest.fixture
def fixed(monkeypatch):
    """The clock stopped at NOW and the system information recorded."""
    import ops.decommission.wizard as wizard

    gmtime = time.gmtime
    monkeypatch.setattr(time, "time", lambda: NOW)
    monkeypatch.setattr(time, "gmtime", lambda t=None: gmtime(NOW if t is None else t))
    monkeypatch.setattr(wizard, "capture", _captured)


def _stage_states() -> StageStates:
    return StageStates("p1", (StageStateRow("prep", "completed", "2 lines | ok", 1_699_990_000.0),
                              StageStateRow("hidden", "failed", None, 0.0)))


def _run(root: Path, dest: Path, stage_states=None, **opts):
    from ops.decommission.inputs import Options
    from ops.decommission.wizard import Decommission
    from ops.hosts.local import LocalHost

    d = Decommission(LocalHost(), "local", str(root), Options(dest, **opts), stage_states=stage_states)
    d.run()
    return d


def _in_order(recorded: dict, got: dict) -> dict:
    """The recorded manifest with its dirs and links in the order of the run's listing."""
    for key in ("dirs", "links"):
        mine = {x["path"]: x for x in recorded[key]}
        assert sorted(mine) == sorted(x["path"] for x in got[key])
        recorded[key] = [mine[x["path"]] for x in got[key]]
    return recorded


def _check(name: str, dest: Path, tmp_path: Path) -> None:
    def norm(data: bytes) -> bytes:
        for p in {str(tmp_path.resolve()), str(tmp_path)}:
            data = data.replace(p.encode(), b"<TMP>")
        return data

    for out in ("PROGRESS.md", "manifest.json", "system-info.json"):
        got = norm((dest / out).read_bytes())
        copy = DATA / name / out
        if RECORD:
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(got)
            continue
        want = copy.read_bytes()
        if out == "manifest.json":
            ordered = _in_order(json.loads(want), json.loads(got))
            want = (json.dumps(ordered, indent=2, ensure_ascii=False) + "\n").encode()
        assert got.decode(errors="replace") == want.decode(errors="replace")
        assert got == want


def test_local_run_notes_are_unchanged(fixed, tmp_path):
    """A node with an excluded class (its metrics read from the node), a FIFO, a link out of the roots
    (NOT SAFE), and plan stage states."""
    root = tmp_path / "node"
    root.mkdir()
    make_tree(root)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "far").mkdir()
    os.symlink(outside, root / "far" / "away")
    os.mkfifo(root / "far" / "pipe")
    os.utime(root / "far", ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    dest = tmp_path / "dest"
    d = _run(root, dest, stage_states=_stage_states(), exclude={"progress"})
    assert d.verdict is not None and not d.verdict.safe
    _check("local", dest, tmp_path)


def test_s3_run_notes_are_unchanged(fixed, tmp_path, moto_s3, request):
    """MD5, multipart (size-only), mismatching and absent S3 objects; no plan."""
    large = {"checkpoints/step-100/model.safetensors": 2 * MiB + 1, "hidden_states/shard_0000.safetensors": 6 * MiB,
             "data/train.jsonl": MiB, "data/eval.jsonl": MiB // 2}
    root, files, s3, bucket = node_and_bucket(tmp_path, request, moto_s3, large)
    key = "runs/r1/"
    store_mixed(s3, bucket, key, files)
    dest = tmp_path / "dest"
    d = _run(root, dest, s3_url=f"s3://{bucket}/runs/r1", s3_endpoint=moto_s3, streams=2)
    assert d.verdict is not None and not d.verdict.safe
    _check("s3", dest, tmp_path)

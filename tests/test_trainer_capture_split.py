"""Split capture: torchrun ranks and `--part I/N` processes write exactly the data of one unsplit run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support import torch_threads
from tests.support.tiny import tiny_target_dir
from tests.test_trainer_hidden_states import write_tokenized
from trainer.hidden_states import cli as hs_cli
from trainer.hidden_states import extract

SAMPLES, SHARD = 9, 2  # 5 shards, the last one short
KW = dict(shard_samples=SHARD, batch_size=2, dtype="float32", device="cpu", log=lambda m: None)
ARGS = ["--shard-samples", str(SHARD), "--batch-size", "2", "--dtype", "float32", "--device", "cpu"]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def one_thread():
    """One compute thread, as each torchrun rank has, so every run does the same arithmetic."""
    with torch_threads.one_thread():
        yield


@pytest.fixture(scope="module")
def unsplit(tmp_path_factory, one_thread):
    root = tmp_path_factory.mktemp("unsplit")
    write_tokenized(root / "tok.jsonl", SAMPLES, seed=3)
    meta = extract.extract_to_dir(tiny_target_dir(), root / "tok.jsonl", root / "hs", **KW)
    return root, meta


def assert_same_data(got: Path, want: Path) -> None:
    """Same index (shard files, sample ids, token counts) and every tensor bit for bit."""
    a, b = json.loads((got / "index.json").read_text()), json.loads((want / "index.json").read_text())
    assert {k: v for k, v in a.items() if k != "data"} == {k: v for k, v in b.items() if k != "data"}
    assert sorted(p.name for p in got.glob("shard-*")) == [s["file"] for s in b["shards"]]
    for s in b["shards"]:
        x, y = load_file(str(got / s["file"])), load_file(str(want / s["file"]))
        assert x.keys() == y.keys()
        for name in y:
            assert x[name].dtype == y[name].dtype and torch.equal(x[name], y[name]), (s["file"], name)


def test_three_parts_equal_one_run_and_resume_per_part(tmp_path, unsplit):
    root, meta = unsplit
    data, out = root / "tok.jsonl", tmp_path / "hs"
    base = ["--model", str(tiny_target_dir()), "--data", str(data), "--out", str(out), *ARGS]
    assert hs_cli.main([*base, "--part", "2/3"]) == 0
    assert hs_cli.main([*base, "--part", "1/3"]) == 0
    assert not (out / "index.json").exists()  # part 3 has not run yet
    part2 = json.loads((out / "index.part-2-of-3.json").read_text())
    assert [s["file"] for s in part2["shards"]] == ["shard-00001.safetensors", "shard-00004.safetensors"]
    assert hs_cli.main([*base, "--part", "3/3"]) == 0
    assert_same_data(out, root / "hs")

    # part 1 is interrupted after its first shard: a rerun of part 1 redoes only what is missing
    index = json.loads((out / "index.part-1-of-3.json").read_text())
    index["shards"] = index["shards"][:1]
    (out / "index.part-1-of-3.json").write_text(json.dumps(index))
    (out / "shard-00003.safetensors").unlink()
    (out / "index.json").unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")}
    got = extract.extract_to_dir(tiny_target_dir(), data, out, part=(0, 3), **KW)
    assert got["shards"] == meta["shards"]
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*") if p.name in kept} == kept
    assert_same_data(out, root / "hs")


@pytest.mark.parametrize("text", ["0/3", "4/3", "1-3", "a/b"])
def test_bad_part_is_one_line(tmp_path, text, capsys):
    write_tokenized(tmp_path / "tok.jsonl", 2)
    rc = hs_cli.main(["--model", str(tiny_target_dir()), "--data", str(tmp_path / "tok.jsonl"),
                  "--out", str(tmp_path / "hs"), "--part", text])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"nodedeck-train: --part {text!r}")


def test_torchrun_two_gloo_ranks_equal_one_run(tmp_path, unsplit):
    root, _ = unsplit
    out = tmp_path / "hs"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "trainer.cli", "hidden-states",
           "--model", str(tiny_target_dir()), "--data", str(root / "tok.jsonl"), "--out", str(out), *ARGS,
           "--progress", str(tmp_path / "progress.jsonl")]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 ranks done" in proc.stderr
    rank1 = json.loads((out / "index.part-2-of-2.json").read_text())
    assert [s["file"] for s in rank1["shards"]] == ["shard-00001.safetensors", "shard-00003.safetensors"]
    assert_same_data(out, root / "hs")
    last = json.loads((tmp_path / "progress.jsonl").read_text().splitlines()[-1])
    assert last["final"] and last["done"] == last["total"] == 5  # rank 0: shards 0, 2, 4

"""Hidden-state extraction: shard format, lazy reader, online extractor, resume, space check."""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from ops.errors import UserError
from tests.support.tiny import tiny_target_dir
from trainer import cli
from trainer.hidden_states import capture, extract, shards
from trainer.hidden_states import cli as hs_cli
from trainer.hidden_states.capture import TargetHiddenStates, default_aux_layers
from trainer.hidden_states.dataset import HiddenStateDataset


def write_tokenized(path: Path, n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        t = rng.randint(3, 30)
        rows.append({"id": f"s{i}", "input_ids": [rng.randrange(700) for _ in range(t)],
                     "loss_mask": [rng.randint(0, 1) for _ in range(t)]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def dflash_hidden_states(root: Path, n: int, seed: int) -> None:
    """n random tokenized samples in root/tok.jsonl and the tiny target's DFlash hidden states of them in
    root/hs: what a training run reads."""
    write_tokenized(root / "tok.jsonl", n, seed=seed)
    extract.extract_to_dir(tiny_target_dir(), root / "tok.jsonl", root / "hs", mode="dflash", dtype="float32",
                      device="cpu", log=lambda m: None)


@pytest.fixture(scope="module")
def model_dir():
    return tiny_target_dir()


def test_default_aux_layers():
    assert default_aux_layers(32) == [1, 15, 28]
    assert default_aux_layers(61) == [1, 29, 57]
    assert default_aux_layers(8) == [1, 3, 4]
    assert default_aux_layers(4) == [0, 1, 2]
    assert default_aux_layers(36, "dflash", 5) == [1, 9, 17, 25, 33]
    assert default_aux_layers(8, "dflash", 5) == [1, 2, 3, 4, 5]


def test_extract_read_and_match_transformers(tmp_path, model_dir):
    from transformers import AutoModelForCausalLM

    rows = write_tokenized(tmp_path / "tok.jsonl", 10)
    meta = extract.extract_to_dir(model_dir, tmp_path / "tok.jsonl", tmp_path / "hs", shard_samples=4, batch_size=3,
                             dtype="float32", progress=tmp_path / "p.jsonl", log=lambda m: None)
    index = json.loads((tmp_path / "hs" / "index.json").read_text())
    assert index == meta
    assert index["format"] == "nodedeck-hidden-states/1" and index["aux_layers"] == [0, 1, 2]
    assert (index["hidden_size"], index["num_layers"], index["num_samples"]) == (64, 4, 10)
    assert [s["file"] for s in index["shards"]] == [f"shard-0000{i}.safetensors" for i in range(3)]
    assert [len(s["ids"]) for s in index["shards"]] == [4, 4, 2]
    assert sum(s["num_tokens"] for s in index["shards"]) == sum(len(r["input_ids"]) for r in rows)

    ds = HiddenStateDataset(tmp_path / "hs")
    assert len(ds) == 10 and ds.ids == [r["id"] for r in rows]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    for i, row in enumerate(rows):
        item = ds[i]
        assert item["input_ids"].tolist() == row["input_ids"]
        assert item["loss_mask"].dtype == torch.uint8 and item["loss_mask"].tolist() == row["loss_mask"]
        with torch.no_grad():
            out = model(torch.tensor([row["input_ids"]]), output_hidden_states=True)
        want_aux = torch.cat([out.hidden_states[layer + 1][0] for layer in (0, 1, 2)], dim=-1)
        assert item["aux"].shape == (len(row["input_ids"]), 3 * 64)
        torch.testing.assert_close(item["aux"], want_aux, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(item["last"], out.hidden_states[-1][0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(model.lm_head(item["last"]), out.logits[0], atol=1e-4, rtol=1e-4)
    progress = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert progress[-1]["final"] and progress[-1]["done"] == 10 and progress[-1]["total"] == 10
    assert all({"ts", "step", "done", "total"} <= set(p) for p in progress)


def test_online_extractor_matches_shards_in_bf16(tmp_path, model_dir):
    rows = write_tokenized(tmp_path / "tok.jsonl", 3, seed=5)
    extract.extract_to_dir(model_dir, tmp_path / "tok.jsonl", tmp_path / "hs", batch_size=1, log=lambda m: None)
    ds = HiddenStateDataset(tmp_path / "hs")
    assert ds.meta["dtype"] == "bfloat16" and ds[0]["aux"].dtype == torch.bfloat16
    online = TargetHiddenStates(model_dir)  # float32, as the CPU extraction computes before storing bf16
    assert online.aux_layers == [0, 1, 2] and online.hidden_size == 64
    ids = torch.tensor([rows[1]["input_ids"]])
    aux, last, logits = online(ids, torch.ones_like(ids), return_logits=True)
    assert torch.equal(aux[0].bfloat16(), ds[1]["aux"]) and torch.equal(last[0].bfloat16(), ds[1]["last"])
    assert logits.shape == (1, ids.shape[1], 768)
    assert online(ids, None)[2] is None


def test_resume_skips_completed_shards(tmp_path, model_dir):
    write_tokenized(tmp_path / "tok.jsonl", 10)
    out = tmp_path / "hs"
    kw = dict(shard_samples=4, batch_size=4, dtype="float32", log=lambda m: None)
    extract.extract_to_dir(model_dir, tmp_path / "tok.jsonl", out, max_samples=6, **kw)
    assert [len(s["ids"]) for s in json.loads((out / "index.json").read_text())["shards"]] == [4, 2]
    first = (out / "shard-00000.safetensors").stat()
    # an interrupted run: the index lists shard 0 only and shard 1 is gone
    index = json.loads((out / "index.json").read_text())
    index["shards"] = index["shards"][:1]
    (out / "index.json").write_text(json.dumps(index))
    (out / "shard-00001.safetensors").unlink()
    meta = extract.extract_to_dir(model_dir, tmp_path / "tok.jsonl", out, **kw)
    assert [len(s["ids"]) for s in meta["shards"]] == [4, 4, 2]
    again = (out / "shard-00000.safetensors").stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    fresh = extract.extract_to_dir(model_dir, tmp_path / "tok.jsonl", tmp_path / "fresh", **kw)
    assert [s["ids"] for s in fresh["shards"]] == [s["ids"] for s in meta["shards"]]
    a, b = HiddenStateDataset(out), HiddenStateDataset(tmp_path / "fresh")
    assert all(torch.equal(a[i]["aux"], b[i]["aux"]) for i in range(10))
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name]

    with pytest.raises(UserError, match="aux_layers"):
        extract.extract_to_dir(model_dir, tmp_path / "tok.jsonl", out, aux_layers=[0, 2], **kw)


def test_space_projection_refuses_before_work(tmp_path, model_dir, monkeypatch, capsys):
    write_tokenized(tmp_path / "tok.jsonl", 4)
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(extract.shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 2**20, 2**20))
    rc = hs_cli.main(["--model", str(model_dir), "--data", str(tmp_path / "tok.jsonl"), "--out", str(tmp_path / "hs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert "B/token" in err[0]  # the projection is printed first
    assert err[-1].startswith("nodedeck-train: ") and "GiB is free" in err[-1]
    assert list((tmp_path / "hs").iterdir()) == []


def test_bad_tokenized_line_is_one_line_error(tmp_path, model_dir, capsys):
    write_tokenized(tmp_path / "tok.jsonl", 2)
    with (tmp_path / "tok.jsonl").open("a") as f:
        f.write(json.dumps({"id": "x", "tokens": [1, 2]}) + "\n")
    rc = cli.main(["hidden-states", "--model", str(model_dir), "--data", str(tmp_path / "tok.jsonl"),
                   "--out", str(tmp_path / "hs")])
    assert rc == 2
    assert capsys.readouterr().err.strip() == (
        f"nodedeck-train: {tmp_path / 'tok.jsonl'}:3: not a tokenized sample: missing ['input_ids', 'loss_mask']"
        " (fields found: ['id', 'tokens'])"
    )
    assert not (tmp_path / "hs" / "index.json").exists()


def test_aux_layer_ids_validated_and_sorted(tmp_path, model_dir, capsys):
    assert capture.check_aux_layers([0, 2], 4) == [0, 2]
    with pytest.raises(UserError, match=r"\[3\] out of range; a target with 4 layers takes ids 0\.\.2"):
        capture.check_aux_layers([0, 3], 4)  # layer 3's output is the final state: no server captures it
    notes = []
    assert capture.check_aux_layers([2, 0, 1], 4, notes.append) == [0, 1, 2]
    assert notes == ["aux layers [2, 0, 1] sorted to [0, 1, 2] (servers capture them in ascending order)"]
    write_tokenized(tmp_path / "tok.jsonl", 2)
    base = ["--model", str(model_dir), "--data", str(tmp_path / "tok.jsonl"), "--dtype", "float32"]
    assert hs_cli.main([*base, "--out", str(tmp_path / "bad"), "--aux-layers", "0,1,3"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "nodedeck-train: aux layers [0, 1, 3]: [3] out of range; a target with 4 layers takes ids 0..2"
        " (the output of layer 3 is the final state)"]
    assert hs_cli.main([*base, "--out", str(tmp_path / "hs"), "--aux-layers", "2,0,1"]) == 0
    assert "sorted to [0, 1, 2]" in capsys.readouterr().err
    assert HiddenStateDataset(tmp_path / "hs").meta["aux_layers"] == [0, 1, 2]


def test_shard_writer_aligned_direct_and_page_cache_paths_agree(tmp_path):
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(0)
    tensors = {"a.ids": torch.arange(7, dtype=torch.int64), "a.aux": torch.randn(7, 9, generator=g).bfloat16(),
               "a.mask": torch.tensor([1, 0, 1], dtype=torch.uint8), "b.aux": torch.randn(5000, 3, generator=g)}
    sizes = [shards.write_shard(tmp_path / "direct.safetensors", dict(tensors)),
             shards.write_shard(tmp_path / "cached.safetensors", dict(tensors), direct=False)]
    data = [(tmp_path / f"{n}.safetensors").read_bytes() for n in ("direct", "cached")]
    assert data[0] == data[1] and sizes == [len(data[0])] * 2
    assert (8 + int.from_bytes(data[0][:8], "little")) % shards.ALIGN == 0  # the data section starts on a block
    back = load_file(str(tmp_path / "direct.safetensors"))
    assert back.keys() == tensors.keys() and all(torch.equal(back[k], v) for k, v in tensors.items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cached.safetensors", "direct.safetensors"]
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):  # tmpfs refuses O_DIRECT: the page-cache path takes over
        target = Path(tempfile.mkdtemp(dir=shm)) / "x.safetensors"
        try:
            shards.write_shard(target, dict(tensors))
            assert target.read_bytes() == data[0]
        finally:
            shutil.rmtree(target.parent)

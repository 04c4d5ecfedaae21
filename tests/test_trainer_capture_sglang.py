"""`--backend sglang`: refused in one line where it cannot run; on a GPU node with sglang and
specforge installed, the captured states match the transformers backend's."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.tiny import tiny_target_dir
from tests.test_trainer_hidden_states import write_tokenized
from trainer import hidden_states as hs

REPO = Path(__file__).resolve().parents[1]
MISSING = [m for m in ("sglang", "specforge") if importlib.util.find_spec(m) is None]


@pytest.mark.skipif(not MISSING and torch.cuda.is_available(), reason="sglang, specforge and a GPU are all here")
def test_refused_in_one_line_before_any_work(tmp_path, capsys):
    write_tokenized(tmp_path / "tok.jsonl", 2)
    rc = hs.main(["--model", str(tiny_target_dir()), "--data", str(tmp_path / "tok.jsonl"),
                  "--out", str(tmp_path / "hs"), "--backend", "sglang"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("nodedeck-train: --backend sglang needs")
    assert not (tmp_path / "hs").exists()


@pytest.mark.skipif(bool(MISSING) or not torch.cuda.is_available(),
                    reason=f"runs only on a CUDA GPU with sglang and specforge installed; here: "
                           f"{', '.join(MISSING) or 'nothing'} missing, CUDA {torch.cuda.is_available()}")
def test_sglang_capture_matches_transformers(tmp_path):
    write_tokenized(tmp_path / "tok.jsonl", 6, seed=9)
    hs.extract_to_dir(tiny_target_dir(), tmp_path / "tok.jsonl", tmp_path / "hf", dtype="bfloat16", device="cuda",
                      log=lambda m: None)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "trainer.cli", "hidden-states", "--backend", "sglang",
                           "--model", str(tiny_target_dir()), "--data", str(tmp_path / "tok.jsonl"),
                           "--out", str(tmp_path / "sg"), "--dtype", "bfloat16"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = hs.HiddenStateDataset(tmp_path / "hf"), hs.HiddenStateDataset(tmp_path / "sg")
    assert json.loads((tmp_path / "sg" / "index.json").read_text())["aux_layers"] == a.meta["aux_layers"]
    for i in range(len(a)):
        assert torch.equal(a[i]["input_ids"], b[i]["input_ids"])
        torch.testing.assert_close(b[i]["aux"].float(), a[i]["aux"].float(), atol=5e-2, rtol=5e-2)
        torch.testing.assert_close(b[i]["last"].float(), a[i]["last"].float(), atol=5e-2, rtol=5e-2)

"""End to end on the tiny target: training learns, online == offline, exact resume, CLI, evaluation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ops.errors import UserError
from tests.support.tiny import tiny_target_dir
from tests.support.torch_threads import one_torch_thread  # noqa: F401  (an autouse fixture)
from trainer import cli
from trainer.evaluate import evaluate_drafter, prompts_from_tokenized, untrained_like
from trainer.export import load_export
from trainer.train import run

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def greedy_data(model, path: Path, n: int, new_tokens: int, seed: int) -> None:
    """Sequences the target itself continues greedily from random 6-token prompts: learnable data."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(10, model.config.vocab_size, (n, 6), generator=g)
    with torch.no_grad():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    with path.open("w") as f:
        for i, row in enumerate(out.tolist()):
            f.write(json.dumps({"id": f"{seed}-{i}", "input_ids": row, "loss_mask": [0] * 6 + [1] * new_tokens}) + "\n")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Tiny target with a sharper head (peaked target distributions), greedy data, vocab, hidden states."""
    from transformers import AutoModelForCausalLM

    from trainer.hidden_states.extract import extract_to_dir
    from trainer.vocab import write_draft_vocab

    root = tmp_path_factory.mktemp("drafter-e2e")
    target = root / "target"
    shutil.copytree(tiny_target_dir(), target)
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    model.save_pretrained(target)
    greedy_data(model, root / "train.jsonl", 64, 40, seed=0)
    greedy_data(model, root / "heldout.jsonl", 8, 40, seed=1)
    write_draft_vocab(root / "train.jsonl", root / "vocab.safetensors", target_vocab_size=model.config.vocab_size,
                      draft_vocab_size=256)
    extract_to_dir(target, root / "train.jsonl", root / "hs", dtype="float32", device="cpu", log=lambda m: None)
    return {"root": root, "target": target, "model": model, "vocab": root / "vocab.safetensors", "hs": root / "hs",
            "train": root / "train.jsonl", "heldout": root / "heldout.jsonl"}


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def accept_lengths(setup, export_dir) -> tuple[float, float, float]:
    """(trained, untrained, greedy match rate) mean accept length on the held-out prompts."""
    target = setup["model"]
    drafter = load_export(export_dir, setup["target"])
    prompts = prompts_from_tokenized(setup["heldout"], 8)
    trained = evaluate_drafter(target, drafter, prompts, max_new=32, k=6, eos=set(), baseline=True)
    fresh = evaluate_drafter(target, untrained_like(drafter, setup["target"]), prompts, max_new=32, k=6, eos=set(),
                             baseline=False)
    return trained["mean_accept_len"], fresh["mean_accept_len"], trained["greedy_match_rate"]


def common(setup, out, *extra):
    return ["--target", str(setup["target"]), "--hidden-states", str(setup["hs"]), "--out", str(out),
            "--batch-size", "8", "--lr", "3e-3", *extra]


def test_eagle3_training_learns_and_beats_untrained(setup, tmp_path):
    out = tmp_path / "eagle3"
    done = run(["--mode", "eagle3", "--vocab", str(setup["vocab"]), *common(setup, out, "--epochs", "10",
                "--log-every", "8")], log=lambda m: None)
    recs = metrics(out)
    assert [r["step"] for r in recs] == list(range(8, 81, 8))
    keys = {"step", "total_steps", "epoch", "loss", "lr", "grad_norm", "tokens_per_s", "accept_len",
            "top4_acc", "top8_acc",
            "streak_top1", "streak_top4", "streak_top8", *(f"acc_{i}" for i in range(7)),
            *(f"ploss_{i}" for i in range(7))}
    assert keys <= set(recs[0]) and all(isinstance(v, (int, float)) for v in recs[-1].values())
    assert recs[-1]["loss"] < recs[0]["loss"] - 1.0
    assert recs[-1]["accept_len"] > recs[0]["accept_len"] + 0.5
    assert recs[-1]["epoch"] == 10.0
    assert done["status"] == "completed" and done["steps"] == 80
    assert json.loads((out / "done.json").read_text())["export"] == str(out / "final")
    trained, untrained, match = accept_lengths(setup, out / "final")
    assert match == 1.0  # greedy speculative decoding reproduces plain greedy decoding
    assert trained > untrained + 0.05


def test_dflash_training_learns_and_beats_untrained(setup, tmp_path):
    out = tmp_path / "dflash"
    run(["--mode", "dflash", *common(setup, out, "--epochs", "10", "--log-every", "8", "--block-size", "8")],
        log=lambda m: None)
    recs = metrics(out)
    assert {"acc_6", "accept_len", "streak_top8", "noise"} <= set(recs[0]) and "acc_7" not in recs[0]
    assert recs[-1]["loss"] < recs[0]["loss"] - 0.5
    assert recs[-1]["accept_len"] > recs[0]["accept_len"] + 0.3
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["dflash_config"]["block_size"] == 8
    trained, untrained, match = accept_lengths(setup, out / "final")
    assert match == 1.0
    assert trained > untrained + 0.05


def test_online_features_match_offline(setup, tmp_path):
    args = ["--mode", "eagle3", "--vocab", str(setup["vocab"]), "--target", str(setup["target"]), "--batch-size", "8",
            "--max-steps", "2"]
    run([*args, "--hidden-states", str(setup["hs"]), "--out", str(tmp_path / "off")], log=lambda m: None)
    run([*args, "--online", "--data", str(setup["train"]), "--out", str(tmp_path / "on")], log=lambda m: None)
    off, on = metrics(tmp_path / "off"), metrics(tmp_path / "on")
    for a, b in zip(off, on):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
        assert a["acc_0"] == pytest.approx(b["acc_0"], abs=1e-6)


class Crash(Exception):
    pass


def test_resume_gives_the_same_losses_as_an_uninterrupted_run(setup, tmp_path):
    """DFlash with feature noise and random anchors: model, optimiser, scheduler, sampler and RNG resume."""
    args = ["--mode", "dflash", "--block-size", "4", "--noise-start", "0.1", "--noise-warmup-steps", "4",
            "--max-steps", "6", "--save-every", "3", "--batch-size", "4"]
    def base(out):
        return [*args, "--target", str(setup["target"]), "--hidden-states", str(setup["hs"]),
                "--out", str(out), "--lr", "3e-3"]
    run(base(tmp_path / "whole"), log=lambda m: None)

    def crash_after_3(trainer, _batch, _loss):
        if trainer.step == 3:
            raise Crash
    with pytest.raises(Crash):
        run(base(tmp_path / "split"), on_step=crash_after_3, log=lambda m: None)
    assert not (tmp_path / "split" / "done.json").exists()
    with pytest.raises(UserError, match="pass --resume"):
        run(base(tmp_path / "split"), log=lambda m: None)
    logs = []
    run([*base(tmp_path / "split"), "--resume"], log=logs.append)
    assert any("resumed from" in m and "at step 3" in m for m in logs)
    whole, split = metrics(tmp_path / "whole"), metrics(tmp_path / "split")
    assert [r["step"] for r in split] == [1, 2, 3, 4, 5, 6]
    for key in ("loss", "noise", "lr", "grad_norm", "acc_0"):
        assert [r[key] for r in split] == [r[key] for r in whole], key
    assert json.loads((tmp_path / "split" / "done.json").read_text())["steps"] == 6


def test_bad_arguments_are_one_line_errors(setup, tmp_path, capsys):
    assert cli.main(["train", "--mode", "eagle3", "--target", str(setup["target"]), "--hidden-states",
                     str(setup["hs"]), "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == \
        "nodedeck-train: --mode eagle3 needs --vocab draft_vocab.safetensors (nodedeck-train vocab)"
    assert cli.main(["train", "--mode", "dflash", "--target", str(setup["target"]), "--hidden-states",
                     str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    assert "no such file (not a hidden-state directory)" in capsys.readouterr().err
    assert cli.main(["export", "--checkpoint", str(tmp_path / "none"), "--out", str(tmp_path / "e")]) == 2
    assert "no checkpoint here" in capsys.readouterr().err


def test_cli_train_export_eval_as_subprocesses(setup, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "run"
    train = subprocess.run(
        [str(BIN / "nodedeck-train"), "train", "--mode", "eagle3", "--vocab", str(setup["vocab"]),
         "--target", str(setup["target"]), "--online", "--data", str(setup["train"]), "--out", str(out),
         "--max-steps", "3", "--batch-size", "8", "--max-samples", "24"],
        capture_output=True, text=True, env=env, timeout=240)
    assert train.returncode == 0, train.stderr
    assert "done: 3 steps" in train.stderr
    done = json.loads((out / "done.json").read_text())
    assert done["samples"] == 24 and done["steps"] == 3 and Path(done["export"], "model.safetensors").exists()
    assert cli.main(["export", "--checkpoint", str(out), "--out", str(tmp_path / "exp"), "--no-embeddings"]) == 0
    assert (tmp_path / "exp" / "config.json").exists()
    result = tmp_path / "eval.json"
    ev = subprocess.run(
        [sys.executable, "-m", "trainer.evaluate", "--target", str(setup["target"]), "--drafter", str(tmp_path / "exp"),
         "--data", str(setup["heldout"]), "--out", str(result), "--num-prompts", "2", "--max-new-tokens", "8",
         "--compare-untrained"], capture_output=True, text=True, env=env, timeout=240, cwd=REPO)
    assert ev.returncode == 0, ev.stderr
    report = json.loads(result.read_text())
    assert report["mode"] == "eagle3" and report["num_prompts"] == 2 and report["num_draft_tokens"] == 7
    assert 1.0 <= report["mean_accept_len"] <= 8.0 and report["greedy_match_rate"] == 1.0
    assert len(report["per_prompt"]) == 2 and report["per_prompt"][0]["new_tokens"] == 8
    assert "untrained" in report and report["baseline_tokens_per_s"] > 0
    import transformers

    assert report["engine"]["name"] == "nodedeck-train eval"          # what measured it, for the Outcome panel
    assert f"transformers {transformers.__version__}, torch {torch.__version__}" in report["engine"]["version"]


def test_sigterm_checkpoints_at_the_next_step_and_resume_finishes(setup, tmp_path):
    import signal

    from trainer.train import Stopped

    out = tmp_path / "stop"
    argv = ["--mode", "eagle3", "--vocab", str(setup["vocab"]), *common(setup, out, "--max-steps", "5")]

    def sigterm_at_2(trainer, _batch, _loss):
        if trainer.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # as `nodedeck tmux stop` / torchrun would send
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Stopped, match="stopped by signal at step 2"):
        run(argv, on_step=sigterm_at_2, log=lambda m: None)
    assert signal.getsignal(signal.SIGTERM) == before  # handlers restored
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-00000002"
    assert not (out / "done.json").exists()
    assert run([*argv, "--resume"], log=lambda m: None)["steps"] == 5


def test_eval_prompt_file_formats(setup, tmp_path):
    from transformers import AutoTokenizer

    from trainer.evaluate import prompts_from_file

    tok = AutoTokenizer.from_pretrained(setup["target"])
    f = tmp_path / "prompts.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in [
        {"id": "chat", "messages": [{"role": "user", "content": "Explain attention."}]},
        {"prompt": "What is the capital of France?"},
        {"input_ids": [5, 6, 7]},
    ]) + "\n")
    got = prompts_from_file(f, tok, 10)
    chat = tok.apply_chat_template([{"role": "user", "content": "Explain attention."}], add_generation_prompt=True)
    chat = chat["input_ids"] if hasattr(chat, "keys") else chat
    assert got[0] == ("chat", list(chat))
    assert tok.decode(got[1][1]).endswith("<|im_start|>assistant\n<think>")  # through the chat template
    assert got[2][1] == [5, 6, 7]
    assert len(prompts_from_file(f, tok, 2)) == 2
    f.write_text('{"text": "no prompt key"}\n')
    with pytest.raises(UserError, match=r"prompts.jsonl:1: expected"):
        prompts_from_file(f, tok, 10)

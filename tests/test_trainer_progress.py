"""Progress records: the NODEDECK_PROGRESS contract, and every `nodedeck-train` step honours it.

Contract (trainer/progress.py): JSON lines {"ts", "done", "total", "unit", "rate"}, a first line at the
start, time-throttled updates, a final line with done == total where the total is known; an I/O error
never reaches the step.
"""

from __future__ import annotations

import json
import math
import time
from types import SimpleNamespace

import pytest

from tests.support.tiny import tiny_target_dir
from tests.support.torch_threads import one_torch_thread  # noqa: F401  (an autouse fixture)
from tests.test_trainer_hidden_states import dflash_hidden_states
from trainer import cli
from trainer import progress as progress_mod
from trainer.progress import ENV, ProgressWriter, progress_path

UNITS = {"steps", "samples", "prompts", "tokens", "shards"}


def records(path, *, step: str, total) -> list[dict]:
    """The file's records, checked against the contract; `total` is the expected total (None: unknown)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) >= 2, lines  # a start line and a final line at least
    for r in lines:
        assert {"ts", "done", "total", "unit", "rate"} <= set(r), r
        assert r["unit"] in UNITS and r["step"] == step and r["total"] == total
        assert isinstance(r["done"], int) and r["done"] >= 0
        assert r["rate"] is None or (isinstance(r["rate"], (int, float)) and math.isfinite(r["rate"]))
    assert [r["done"] for r in lines] == sorted(r["done"] for r in lines)  # monotone
    assert [r["ts"] for r in lines] == sorted(r["ts"] for r in lines)
    assert lines[0]["rate"] is None and not lines[0].get("final")
    assert lines[-1]["final"] is True and "error" not in lines[-1]
    assert not any(r.get("final") for r in lines[:-1])
    if total is not None:
        assert lines[-1]["done"] == total
    return lines


# ---- the ProgressWriter ------------------------------------------------------------------------------

def test_updates_are_time_throttled_not_per_item(tmp_path):
    path = tmp_path / "p.jsonl"
    with ProgressWriter(path, "x", 10_000, unit="samples", interval=3600) as prog:
        for _ in range(10_000):
            prog.advance()
    lines = records(path, step="x", total=10_000)
    assert len(lines) == 2 and lines[0]["done"] == 0  # start and final only: the interval never passed


def test_rate_is_units_per_second_between_lines(tmp_path, monkeypatch):
    clock = iter([0.0, 0.0, 2.0, 2.5, 3.0, 3.0])  # init, start, then one reading per call below
    monkeypatch.setattr(progress_mod, "time", SimpleNamespace(monotonic=lambda: next(clock), time=time.time))
    path = tmp_path / "p.jsonl"
    prog = ProgressWriter(path, "x", 16, unit="steps").start()
    prog.advance(10)  # t=2: 10 units in the 2 s since the start line
    prog.advance(1)   # t=2.5: within the 1 s interval, no line
    prog.advance(5)   # t=3: 6 units in the 1 s since the last line
    prog.close()      # t=3: forced, no time since the last line: rate null
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(r["done"], r["rate"]) for r in lines] == [(0, None), (10, 5.0), (16, 6.0), (16, None)]
    assert lines[-1]["final"] and lines[-1]["done"] == lines[-1]["total"]


def test_env_path_and_rank_suffix(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "run.progress"))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert progress_path() == tmp_path / "run.progress"
    assert progress_path(tmp_path / "explicit") == tmp_path / "explicit"  # --progress wins
    assert progress_path(rank=0, world_size=4) == tmp_path / "run.progress"  # rank 0: the plain path
    assert progress_path(rank=3, world_size=4) == tmp_path / "run.progress.rank3"
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert progress_path() == tmp_path / "run.progress.rank2"
    monkeypatch.delenv(ENV)
    assert progress_path() is None and ProgressWriter(None, "x").path is None
    assert ProgressWriter(False, "x").path is None


def test_a_full_disk_never_reaches_the_step(tmp_path):
    with ProgressWriter("/dev/full", "x", 3, interval=0) as prog:  # every write fails with ENOSPC
        for _ in range(3):
            prog.advance()
    blocked = tmp_path / "file"
    blocked.write_text("")
    with ProgressWriter(blocked / "sub" / "p.jsonl", "x", 1) as prog:  # the directory cannot be created
        prog.advance()
    assert prog.done == 1


def test_a_failing_step_ends_with_an_error_line(tmp_path):
    path = tmp_path / "p.jsonl"
    with pytest.raises(ValueError), ProgressWriter(path, "x", 5) as prog:
        prog.advance(2)
        raise ValueError("bad record\nmore")
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["final"] and last["done"] == 2 and last["error"] == "bad record"


# ---- every step, through $NODEDECK_PROGRESS ---------------------------------------------------

@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """Tokenized data, DFlash hidden states and a 3-step training run on the tiny target."""
    from trainer.train import run

    root = tmp_path_factory.mktemp("progress")
    dflash_hidden_states(root, 6, seed=3)
    run(["--mode", "dflash", "--target", str(tiny_target_dir()), "--hidden-states", str(root / "hs"),
         "--out", str(root / "train"), "--num-workers", "0", "--max-steps", "3", "--draft-layers", "1",
         "--progress", str(root / "train.progress")], log=lambda m: None)
    return root


@pytest.fixture
def env_progress(tmp_path, monkeypatch):
    path = tmp_path / "step.progress"
    monkeypatch.setenv(ENV, str(path))
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return path


def test_train_writes_steps(pipeline):
    lines = records(pipeline / "train.progress", step="train", total=3)
    assert {r["unit"] for r in lines} == {"steps"}


def test_train_reads_the_env(pipeline, env_progress, tmp_path):
    from trainer.train import run

    run(["--mode", "dflash", "--target", str(tiny_target_dir()), "--hidden-states", str(pipeline / "hs"),
         "--out", str(tmp_path / "t"), "--num-workers", "0", "--max-steps", "2", "--draft-layers", "1"],
        log=lambda m: None)
    records(env_progress, step="train", total=2)


def test_hidden_states_writes_samples(pipeline, env_progress, tmp_path):
    assert cli.main(["hidden-states", "--model", str(tiny_target_dir()), "--data", str(pipeline / "tok.jsonl"),
                     "--out", str(tmp_path / "hs"), "--dtype", "float32", "--device", "cpu",
                     "--shard-samples", "2"]) == 0
    lines = records(env_progress, step="hidden-states", total=6)
    assert {r["unit"] for r in lines} == {"samples"}


def test_vocab_and_tokenize_write_samples(pipeline, env_progress, tmp_path):
    assert cli.main(["vocab", "--data", str(pipeline / "tok.jsonl"), "--model", str(tiny_target_dir()),
                     "--draft-vocab-size", "64", "--out", str(tmp_path / "v.safetensors")]) == 0
    records(env_progress, step="vocab", total=6)
    env_progress.unlink()
    convo = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]
    (tmp_path / "s.jsonl").write_text("".join(
        json.dumps({"id": f"c{i}", "source": "t", "kind": "target-native", "messages": convo}) + "\n"
        for i in range(3)))
    assert cli.main(["tokenize", "--model", str(tiny_target_dir()), "--input", str(tmp_path / "s.jsonl"),
                     "--out", str(tmp_path / "t.jsonl")]) == 0
    records(env_progress, step="tokenize", total=3)


def test_prep_writes_samples(env_progress, tmp_path):
    (tmp_path / "src.jsonl").write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(4)))
    reg = tmp_path / "datasets.toml"
    reg.write_text(f'[datasets.local]\nsource = "{tmp_path / "src.jsonl"}"\nkind = "prompt-only"\n')
    assert cli.main(["prep", "--dataset", "local", "--registry", str(reg), "--out", str(tmp_path / "o")]) == 0
    records(env_progress, step="prep", total=4)


def test_export_writes_its_shard(pipeline, env_progress, tmp_path):
    assert cli.main(["export", "--checkpoint", str(pipeline / "train"), "--out", str(tmp_path / "x")]) == 0
    lines = records(env_progress, step="export", total=1)
    assert lines[-1]["unit"] == "shards"


def test_eval_writes_prompts(pipeline, env_progress, tmp_path):
    assert cli.main(["eval", "--target", str(tiny_target_dir()), "--drafter", str(pipeline / "train" / "final"),
                     "--data", str(pipeline / "tok.jsonl"), "--num-prompts", "2", "--max-new-tokens", "3",
                     "--no-baseline", "--compare-untrained", "--device", "cpu", "--out", str(tmp_path / "e.json")]) == 0
    lines = records(env_progress, step="eval", total=4)  # 2 prompts, trained and untrained
    assert lines[-1]["unit"] == "prompts"


def test_tiny_writes_its_pretraining_steps(env_progress, tmp_path):
    convo = [{"role": "user", "content": "what is two plus two"}, {"role": "assistant", "content": "four"}]
    (tmp_path / "corpus.jsonl").write_text("".join(
        json.dumps({"id": f"c{i}", "source": "t", "kind": "target-native", "messages": convo}) + "\n"
        for i in range(2)))
    assert cli.main(["tiny", "--out", str(tmp_path / "m"), "--num-layers", "1", "--hidden-size", "32",
                     "--corpus", str(tmp_path / "corpus.jsonl"), "--pretrain-steps", "3"]) == 0
    lines = records(env_progress, step="tiny", total=3)
    assert lines[-1]["unit"] == "steps"


def test_serve_counts_requests_served(tmp_path):
    from trainer.serve import SamplingParams, ServeEngine

    path = tmp_path / "serve.progress"
    engine = ServeEngine(tiny_target_dir(), model_name="tiny", threads=1, log=lambda line: None,
                    progress=ProgressWriter(path, "serve", None, unit="prompts").start())
    engine.start()
    try:
        assert engine.loaded.wait(60) and engine.load_error is None
        futures = [engine.submit([5, 6, 7], SamplingParams(2)) for _ in range(3)]
        assert all(len(f.result(60)) <= 2 for f in futures)
    finally:
        engine.stop()
        engine.progress.close()
    lines = records(path, step="serve", total=None)
    assert lines[-1]["done"] == 3


def test_a_resumed_step_starts_from_its_done_units(tmp_path, monkeypatch):
    clock = iter([0.0, 0.0, 2.0, 2.0])
    monkeypatch.setattr(progress_mod, "time", SimpleNamespace(monotonic=lambda: next(clock), time=time.time))
    path = tmp_path / "p.jsonl"
    with ProgressWriter(path, "x", 10, unit="steps", done=7) as prog:
        prog.advance(3)  # t=2: 3 new units in 2 s, not the 7 from before the restart
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(r["done"], r["rate"]) for r in lines] == [(7, None), (10, 1.5), (10, None)]


def test_regen_writes_samples_and_a_rerun_starts_from_what_is_done(env_progress, tmp_path):
    from tests.test_trainer_regen import prompt, write_samples
    from trainer.serve import BackgroundServer, ServeEngine

    engine = ServeEngine(tiny_target_dir(), model_name="tiny", threads=1, log=lambda line: None)
    server = BackgroundServer(engine)
    try:
        assert engine.loaded.wait(60) and engine.load_error is None
        inp = write_samples(tmp_path / "in.jsonl", [prompt(i, f"q{i}") for i in range(3)])
        argv = ["regen", "--input", str(inp), "--out", str(tmp_path / "out.jsonl"), "--base-url", server.url + "/v1",
                "--model", "tiny", "--concurrency", "2", "--max-tokens", "2", "--window", "60"]
        assert cli.main([*argv, "--max-samples", "1"]) == 0
        records(env_progress, step="regen", total=1)
        env_progress.unlink()
        assert cli.main(argv) == 0
    finally:
        server.stop()
    lines = records(env_progress, step="regen", total=3)
    assert lines[0]["done"] == 1  # the sample the first run wrote

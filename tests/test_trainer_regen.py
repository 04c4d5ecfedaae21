"""Regeneration against the real tiny-model server and against a fake that fails on purpose."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest
from aiohttp import web

from tests.support.tiny import tiny_target_dir
from trainer import regen
from trainer.serve import BackgroundServer, ServeEngine


def write_samples(path, samples):
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    return path


def prompt(i, *turns):
    return {"id": f"p{i}", "source": "t", "kind": "prompt-only",
            "messages": [{"role": "user", "content": t} for t in turns]}


NATIVE = {"id": "n0", "source": "t", "kind": "target-native",
          "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}


@pytest.fixture(scope="module")
def server():
    engine = ServeEngine(tiny_target_dir(), model_name="tiny", threads=1, log=lambda line: None, log_interval=0.2)
    srv = BackgroundServer(engine)
    assert engine.loaded.wait(60) and engine.load_error is None
    yield srv
    srv.stop()


def read_jsonl(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_regen_against_real_server_smoke_then_resume(tmp_path, server):
    inp = write_samples(tmp_path / "in.jsonl",
                        [prompt(0, "Hi"), prompt(1, "What is 2+2?", "And 3+3?"), NATIVE]
                        + [prompt(i, f"q{i}") for i in range(2, 6)])
    out = tmp_path / "out.jsonl"
    kw = dict(base_url=server.url + "/v1", model="tiny", concurrency=4, max_tokens=6, temperature=0.0,
              progress=tmp_path / "progress.jsonl", throughput=tmp_path / "tp.jsonl", log=lambda m: None)
    smoke = asyncio.run(regen.run(inp, out, max_samples=2, **kw))
    assert smoke["written"] == 2 and {r["id"] for r in read_jsonl(out)} == {"p0", "p1"}

    full = asyncio.run(regen.run(inp, out, **kw))
    assert full["already_done"] == 2 and full["written"] == 5 and full["passed_through"] == 1
    rows = {r["id"]: r for r in read_jsonl(out)}
    assert len(rows) == 7 and rows["n0"] == NATIVE
    two = rows["p1"]
    assert two["kind"] == "target-native" and [m["role"] for m in two["messages"]] == ["user", "assistant"] * 2
    for turn in two["messages"][1::2]:
        assert set(turn) <= {"role", "content", "reasoning_content"} and "reasoning_content" in turn
    assert two["regen"]["model"] == "tiny" and len(two["regen"]["finish_reasons"]) == 2
    assert set(two["regen"]["finish_reasons"]) <= {"length", "stop"}
    finals = [r for r in read_jsonl(tmp_path / "tp.jsonl") if r.get("final")]
    assert [r["total_requests"] for r in finals] == [3, 4]  # smoke: p0 + p1's two turns; then p2..p5
    assert all(0 < r["total_completion_tokens"] <= 6 * r["total_requests"] for r in finals)
    prog = read_jsonl(tmp_path / "progress.jsonl")[-1]
    assert prog["final"] and prog["done"] == prog["total"] == 7

    # a crash mid-write leaves a torn line: it is cut and nothing is redone
    with out.open("a") as f:
        f.write('{"id": "p9", "sour')
    again = asyncio.run(regen.run(inp, out, **kw))
    assert again["written"] == 0 and again["already_done"] == 7
    assert len(read_jsonl(out)) == 7


class FakeServer:
    """An OpenAI-ish server: each prompt fails `fails` times (500, then 429, with a Retry-After), then answers
    with `message.reasoning` (vLLM style); a prompt containing 'reject' gets a 400 whose message spans lines,
    one containing 'garbled' a 200 that is not JSON.
    `attempts` keeps, per prompt, the retry number the client put on each request."""

    def __init__(self, fails=2):
        self.fails = fails
        self.seen: dict[str, int] = {}
        self.attempts: dict[str, list[str | None]] = {}
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        self.loop.run_until_complete(web.SockSite(self.runner, sock).start())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def models(self, request):
        return web.json_response({"data": [{"id": "fake"}]})

    async def chat(self, request):
        body = await request.json()
        text = body["messages"][-1]["content"]
        n = self.seen[text] = self.seen.get(text, 0) + 1
        self.attempts.setdefault(text, []).append(request.headers.get("x-stainless-retry-count"))
        if "reject" in text:
            return web.json_response({"error": {"message": "prompt\n  too long"}}, status=400)
        if "garbled" in text:
            return web.Response(text="{not json", content_type="application/json")
        if n <= self.fails:
            status = 500 if n == 1 else 429
            return web.json_response({"error": {"message": "busy"}}, status=status, headers={"Retry-After": "0.05"})
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": f"A:{text}",
                                                           "reasoning": f"R:{text}"}, "finish_reason": "stop"}],
                                  "usage": {"prompt_tokens": 3, "completion_tokens": 5}})

    def stop(self):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_retries_both_reasoning_fields_and_rejected_samples(tmp_path, monkeypatch):
    dead = socket.create_server(("127.0.0.1", 0))
    dead_url = f"http://127.0.0.1:{dead.getsockname()[1]}"
    dead.close()
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):   # a node's proxy is not used
        monkeypatch.setenv(name, dead_url)
    fake = FakeServer(fails=2)
    try:
        inp = write_samples(tmp_path / "in.jsonl", [prompt(0, "one"), prompt(1, "two"), prompt(2, "reject me"),
                                                     prompt(3, "garbled")])
        out = tmp_path / "out.jsonl"
        logged: list[str] = []
        summary = asyncio.run(regen.run(inp, out, base_url=fake.url, model="fake", concurrency=2,
                                        log=logged.append))
    finally:
        fake.stop()
    assert summary["written"] == 2 and summary["failed"] == 2 and summary["retries"] == 4
    assert fake.seen == {"one": 3, "two": 3, "reject me": 1, "garbled": 1}  # 4xx and a broken 200 are not retried
    # the retries are the openai client's own (it numbers each attempt of a call), counted from its requests
    assert fake.attempts["one"] == fake.attempts["two"] == ["0", "1", "2"]
    assert sum("regen: retry 1 of POST" in line for line in logged) == 2
    rows = {r["id"]: r for r in read_jsonl(out)}
    assert rows["p0"]["messages"][1] == {"role": "assistant", "content": "A:one", "reasoning_content": "R:one"}
    errors = read_jsonl(tmp_path / "out.jsonl.errors.jsonl")
    assert sorted(errors, key=lambda e: e["id"]) == [
        {"id": "p2", "error": "HTTP 400: prompt too long"},
        {"id": "p3", "error": "HTTP 200: the server answered 200 with a body that is not a JSON object"}]


def test_a_server_failing_through_every_retry_stops_the_run_with_its_last_answer(tmp_path):
    fake = FakeServer(fails=5)
    try:
        inp = write_samples(tmp_path / "in.jsonl", [prompt(0, "one")])
        with pytest.raises(regen.ServerGaveUp) as failed:
            asyncio.run(regen.run(inp, tmp_path / "out.jsonl", base_url=fake.url, model="fake", concurrency=1,
                                  retries=1, log=lambda m: None))
    finally:
        fake.stop()
    assert fake.seen == {"one": 2}
    assert str(failed.value) == (f"{fake.url}/chat/completions: gave up after 2 attempts (HTTP 429: busy); "
                                 "rerun the same command to resume")
    assert (tmp_path / "out.jsonl").read_text() == ""


def test_reasoning_content_is_preferred_and_parsed():
    message = {"content": "x", "reasoning_content": "r"}
    turn, reason, usage = regen.assistant_turn({"choices": [{"message": message, "finish_reason": "length"}],
                                                "usage": {"completion_tokens": 2}})
    assert turn == {"role": "assistant", "content": "x", "reasoning_content": "r"} and reason == "length"
    turn, _, _ = regen.assistant_turn({"choices": [{"message": {"content": None}}]})
    assert turn == {"role": "assistant", "content": ""}


def test_unreachable_server_gives_up_with_one_line(tmp_path, capsys):
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    inp = write_samples(tmp_path / "in.jsonl", [prompt(0, "x")])
    rc = regen.main(["--input", str(inp), "--out", str(tmp_path / "o.jsonl"), "--base-url", f"http://127.0.0.1:{port}/v1",
                     "--model", "m", "--retries", "2"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("nodedeck-train: http://127.0.0.1:") and "gave up after 3 attempts" in err
    assert (tmp_path / "o.jsonl").read_text() == ""


def test_wrong_model_name_and_bad_input_fail_before_work(tmp_path, capsys, server):
    inp = write_samples(tmp_path / "in.jsonl", [prompt(0, "x")])
    rc = regen.main(["--input", str(inp), "--out", str(tmp_path / "o.jsonl"), "--base-url", server.url + "/v1",
                     "--model", "other"])
    assert rc == 2 and "model 'other' is not served there (served: tiny)" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "messages": []}\n')
    rc = regen.main(["--input", str(bad), "--out", str(tmp_path / "o2.jsonl"), "--base-url", server.url + "/v1",
                     "--model", "tiny"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == (
        f"nodedeck-train: {bad}:1: not a nodedeck sample: missing ['source', 'kind'] "
        "(fields found: ['id', 'messages'])")
    assert not (tmp_path / "o2.jsonl").exists()


def test_pipeline_prep_regen_tokenize_vocab_hidden_states(tmp_path, server):
    """The data pipeline end to end on the tiny model: every step's output feeds the next."""
    from trainer import prep, tokenization, vocab
    from trainer.hidden_states import cli as hs_cli
    from trainer.hidden_states.dataset import HiddenStateDataset

    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps({"conversations": [{"from": "human", "value": f"Tell me about {w}."},
                                                         {"from": "gpt", "value": "Not the target's answer."}]}) + "\n"
                           for w in ("cats", "dogs", "owls", "bees")))
    assert prep.main(["--dataset", "pets", "--source", str(raw), "--kind", "prompt-only", "--out",
                      str(tmp_path / "prep")]) == 0
    assert regen.main(["--input", str(tmp_path / "prep" / "pets.jsonl"), "--out", str(tmp_path / "regen.jsonl"),
                       "--base-url", server.url + "/v1", "--model", "tiny", "--max-tokens", "16",
                       "--temperature", "0"]) == 0
    model = str(tiny_target_dir())
    assert tokenization.main(["--model", model, "--input", str(tmp_path / "regen.jsonl"),
                              "--out", str(tmp_path / "tok.jsonl")]) == 0
    assert vocab.main(["--data", str(tmp_path / "tok.jsonl"), "--model", model, "--draft-vocab-size", "64",
                       "--out", str(tmp_path / "dv.safetensors")]) == 0
    assert hs_cli.main(["--model", model, "--data", str(tmp_path / "tok.jsonl"), "--out", str(tmp_path / "hs"),
                               "--shard-samples", "3"]) == 0
    tok_rows = {r["id"]: r for r in read_jsonl(tmp_path / "tok.jsonl")}
    regen_rows = {r["id"]: r for r in read_jsonl(tmp_path / "regen.jsonl")}
    ds = HiddenStateDataset(tmp_path / "hs")
    assert sorted(ds.ids) == sorted(tok_rows) == sorted(regen_rows) and len(ds) == 4
    for i, sid in enumerate(ds.ids):
        item = ds[i]
        assert item["input_ids"].tolist() == tok_rows[sid]["input_ids"]
        assert item["loss_mask"].tolist() == tok_rows[sid]["loss_mask"]
        assert "Not the target's answer." not in json.dumps(regen_rows[sid])
    d2t, t2d = vocab.load_draft_vocab(tmp_path / "dv.safetensors")
    assert len(d2t) == 64 and int(t2d.sum()) == 64

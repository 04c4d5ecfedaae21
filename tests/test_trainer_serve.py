"""The OpenAI-compatible tiny-model server: endpoints, batching, metrics, SGLang log lines."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.tiny import tiny_target_dir
from trainer.serve import BackgroundServer, ServeEngine

REPO = Path(__file__).resolve().parents[1]


def http(url, body=None, timeout=60):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def served():
    lines: list[str] = []
    engine = ServeEngine(tiny_target_dir(), model_name="tiny", threads=1, log=lines.append, log_interval=0.1,
                    max_running=4)
    srv = BackgroundServer(engine)
    assert engine.loaded.wait(60) and engine.load_error is None
    yield srv, lines
    srv.stop()


def chat(url, content, **kw):
    status, text = http(url + "/v1/chat/completions",
                        {"model": "tiny", "messages": [{"role": "user", "content": content}], **kw})
    return status, json.loads(text)


def test_chat_completion_shape_and_greedy_determinism(served):
    srv, _ = served
    status, a = chat(srv.url, "Hello there", max_tokens=12, temperature=0)
    assert status == 200
    assert a["object"] == "chat.completion" and a["model"] == "tiny"
    choice = a["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
    usage = a["usage"]
    assert 1 <= usage["completion_tokens"] <= 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # the prompt ends with <think>: output up to </think> is reasoning
    assert "reasoning_content" in choice["message"]
    _, b = chat(srv.url, "Hello there", max_tokens=12, temperature=0)
    assert b["choices"][0]["message"] == choice["message"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_target_dir()))
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hello there"}], tokenize=False,
                                     add_generation_prompt=True)
    assert usage["prompt_tokens"] == len(tok.encode(prompt, add_special_tokens=False))


def test_concurrent_requests_are_batched_and_counted(served):
    srv, lines = served
    before = metric_values(http(srv.url + "/metrics")[1])
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: chat(srv.url, f"q{i}", max_tokens=40, temperature=0.8), range(8)))
    assert all(status == 200 for status, _ in results)
    after = metric_values(http(srv.url + "/metrics")[1])
    generated = sum(r["usage"]["completion_tokens"] for _, r in results)
    assert after["sglang:num_requests_total"] - before["sglang:num_requests_total"] == 8
    assert after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"] == generated
    assert after["sglang:prompt_tokens_total"] - before["sglang:prompt_tokens_total"] == sum(
        r["usage"]["prompt_tokens"] for _, r in results)
    prefill = [line for line in lines if "Prefill batch" in line]
    assert any(int(re.search(r"#new-seq: (\d+)", line).group(1)) > 1 for line in prefill)  # batched
    assert max(int(re.search(r"#new-seq: (\d+)", line).group(1)) for line in prefill) <= 4


def metric_values(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = float(value)
    return out


def test_bad_requests_get_openai_errors(served):
    srv, _ = served
    assert http(srv.url + "/v1/chat/completions", {"messages": []})[0] == 400
    status, text = chat(srv.url, "x", max_tokens=5000)
    assert status == 400 and "exceeds the context length" in text["error"]["message"]
    status, text = http(srv.url + "/v1/chat/completions",
                        {"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert status == 404 and json.loads(text)["error"]["type"] == "model_not_found"
    assert chat(srv.url, "x", stream=True)[0] == 400
    req = urllib.request.Request(srv.url + "/v1/chat/completions", data=b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400


def test_cli_server_health_models_metrics_and_decode_log(tmp_path):
    log = tmp_path / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer.cli", "serve", "--model", str(tiny_target_dir()), "--port", "0",
         "--log", str(log), "--log-interval", "0.2", "--threads", "1", "--served-model-name", "tiny"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        url = None
        while url is None and time.monotonic() < deadline:
            m = re.search(r"listening on (http://\S+)", log.read_text() if log.exists() else "")
            url = m and m.group(1)
            time.sleep(0.05)
        assert url, proc.stderr.read().decode() if proc.poll() is not None else "no listening line"
        statuses = set()
        while time.monotonic() < deadline:
            status, _ = http(url + "/health")
            statuses.add(status)
            if status == 200:
                break
            time.sleep(0.05)
        assert 200 in statuses and statuses <= {200, 503}
        models = json.loads(http(url + "/v1/models")[1])
        assert models["data"][0]["id"] == "tiny"
        assert chat(url, "count", max_tokens=30, temperature=0.5)[0] == 200
        text = http(url + "/metrics")[1]
        for name in ("sglang:gen_throughput", "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                     "sglang:generation_tokens_total", "sglang:prompt_tokens_total", "sglang:num_requests_total"):
            assert re.search(rf'^{name}{{model_name="tiny",tp_rank="0"}} ', text, re.M), name
        assert json.loads(http(url + "/health_generate")[1]) == {"status": "ok"}
        info = json.loads(http(url + "/get_server_info")[1])
        assert "last_gen_throughput" in info["internal_states"][0]
        deadline = time.monotonic() + 5
        while "Decode batch" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        decode = [line for line in log.read_text().splitlines() if "Decode batch" in line]
        assert decode
        assert re.fullmatch(
            r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] Decode batch, #running-req: \d+, #token: \d+, "
            r"token usage: \d+\.\d\d, gen throughput \(token/s\): \d+\.\d\d, #queue-req: \d+", decode[0])
    finally:
        proc.terminate()
        proc.wait(10)


def test_cli_rejects_a_missing_model_dir(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "trainer.serve", "--model", str(tmp_path), "--port", "0"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"nodedeck-train: {tmp_path}: not a model directory (no config.json)"


def test_request_is_counted_before_its_future_resolves():
    """A client woken by its answer must already see it in /metrics (counter, latency, running 0)."""
    import threading

    attached = threading.Event()

    def generate(_model, _tokenizer, prompts, _params, on_step):
        assert attached.wait(30)  # the callback below is in place before any answer exists
        on_step(len(prompts))
        return [[1, 2] for _ in prompts]

    engine = ServeEngine(tiny_target_dir(), model_name="tiny", threads=1, log=lambda line: None, generate_fn=generate)
    engine.start()
    assert engine.loaded.wait(60) and engine.load_error is None
    try:
        seen = []
        called = threading.Event()

        def on_done(_future):  # runs inside set_result, on the engine thread
            text = engine.metrics.render().decode()
            seen.append({name: float(re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M).group(1))
                         for name in ("sglang:num_requests_total", "sglang:e2e_request_latency_seconds_count",
                                      "sglang:num_running_reqs")})
            called.set()

        from trainer.serve import SamplingParams

        future = engine.submit([5, 6, 7], SamplingParams(2))
        future.add_done_callback(on_done)
        attached.set()
        assert future.result(timeout=60) == [1, 2]
        assert called.wait(60)   # set_result wakes result() before it runs the callbacks
        assert seen == [{"sglang:num_requests_total": 1.0, "sglang:e2e_request_latency_seconds_count": 1.0,
                         "sglang:num_running_reqs": 0.0}]
    finally:
        engine.stop()


def test_a_chat_template_without_tools_is_called_without_them():
    """A remote-code tokenizer's apply_chat_template may take no `tools`: a request without tools must not
    pass it (one with tools does)."""
    from trainer.serve import ServedModel

    class NoTools:
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return "".join(m["content"] for m in messages) + ("<gen>" if add_generation_prompt else "")

    class WithTools(NoTools):
        def apply_chat_template(self, messages, tokenize, add_generation_prompt, tools=None):
            return f"{len(tools or [])} tools:" + super().apply_chat_template(messages, tokenize, add_generation_prompt)

    msgs = [{"role": "user", "content": "hi"}]
    assert ServedModel(None, NoTools()).chat_prompt(msgs, None) == "hi<gen>"   # type: ignore[arg-type]
    assert ServedModel(None, NoTools()).chat_prompt(msgs, []) == "hi<gen>"   # type: ignore[arg-type]
    assert ServedModel(None, WithTools()).chat_prompt(msgs, [{"type": "function"}]) == "1 tools:hi<gen>"  # type: ignore[arg-type]

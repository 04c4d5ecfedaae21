"""Real vLLM serves the demo's target with its EAGLE-3 export: the engine's outputs and counters are the eval's,
and nodedeck's readers (metrics, the Inference panel's source, the log parser) agree with the raw /metrics."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from ops.hosts.local import LocalHost
from ops.telemetry.inference import InferenceMetrics
from ops.telemetry.serverlog import ServerLogMetrics, parse_log_line
from tests.engines.vllm_server import VllmServer
from trainer.evaluate import _eos_ids, greedy_decode, prompts_from_tokenized

pytestmark = [pytest.mark.engines, pytest.mark.timeout(1200)]   # real vLLM servers start in minutes on 2 CPUs

K = 4                  # the demo's eval: 6 prompts, 24 new tokens, 4 draft tokens
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
DRAFTS = "vllm:spec_decode_num_drafts"


def raw(page: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of a /metrics page, by the Prometheus client's own parser (the oracle)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(page):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def one(samples, name: str, **labels: str) -> float:
    return sum(v for lb, v in samples.get(name, []) if all(lb.get(k) == x for k, x in labels.items()))


@pytest.fixture(scope="module")
def eagle3_server(demo, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-eagle3") / "server.log"
    spec = {"method": "eagle3", "model": str(demo.eagle3), "num_speculative_tokens": K}
    with VllmServer(demo.target, log, speculative=spec) as server:
        yield server


def test_greedy_outputs_and_acceptance_equal_the_eval(demo, eagle3_server):
    """Prompt by prompt: vLLM's tokens are the HF target's greedy tokens, its draft and accept counters are the
    eval's rounds and accepted tokens, so 1 + accepted/drafts is the eval's mean acceptance length exactly."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ev = json.loads(demo.eval_json.read_text())
    assert (ev["num_prompts"], ev["max_new_tokens"], ev["num_draft_tokens"]) == (6, 24, K)
    prompts = prompts_from_tokenized(demo.tokenized, ev["num_prompts"])
    target = AutoModelForCausalLM.from_pretrained(demo.target, dtype=torch.float32).eval()
    eos = _eos_ids(target, AutoTokenizer.from_pretrained(demo.target))
    drafts = accepted = 0
    for (pid, prompt), rec in zip(prompts, ev["per_prompt"], strict=True):
        assert rec["id"] == pid
        before = raw(eagle3_server.metrics())
        out = eagle3_server.complete(prompt, ev["max_new_tokens"])
        after = raw(eagle3_server.metrics())
        got = out["choices"][0]["token_ids"]
        assert got == greedy_decode(target, prompt, ev["max_new_tokens"], eos), pid
        d = one(after, DRAFTS + "_total") - one(before, DRAFTS + "_total")
        a = one(after, ACCEPTED + "_total") - one(before, ACCEPTED + "_total")
        assert (d, a) == (rec["rounds"], round(rec["accept_len"] * rec["rounds"]) - rec["rounds"]), pid
        drafts, accepted = drafts + d, accepted + a
    assert 1 + accepted / drafts == pytest.approx(ev["mean_accept_len"], abs=1e-12)
    assert ev["mean_accept_len"] > 1.5                       # the trained drafter is accepted, not just run


def test_the_train_serve_verdict_agrees_prompt_for_prompt(demo, eagle3_server, tmp_path):
    """`nodedeck-train probe` of this server on the eval's prompts, judged by `nodedeck plan outcome`: the export as
    trained agrees with the eval, every prompt round for round (its broken twins: test_vllm_train_serve.py)."""
    from tests.engines.test_vllm_train_serve import plan_verdict, probe

    ev = json.loads(demo.eval_json.read_text())
    probe(eagle3_server, demo.tokenized, ev, tmp_path / "served.json")
    verdict = plan_verdict(eagle3_server, demo.eval_json, tmp_path)
    assert verdict["state"] == "agree" and verdict["causes"] == [], verdict["line"]
    assert verdict["prompts_parted"] == {"parted": 0, "prompts": ev["num_prompts"]}
    assert verdict["serving"]["value"] == pytest.approx(ev["mean_accept_len"], abs=1e-9)
    assert verdict["serving"]["per_position"] == pytest.approx(ev["per_position_acceptance"], abs=1e-9)


def test_readers_agree_with_the_raw_metrics_page(demo, eagle3_server, tmp_path):
    """Under load and after it: nodedeck's /metrics reader, the dashboard source's Inference view and the log
    parser read the live server; each agrees with the raw page (the Prometheus client's parse) read with it."""
    from tui.live import LiveSource

    (tmp_path / "nodes.toml").write_text(f'[nodes.local]\nroot = "{tmp_path}"\n'
                                         f'metrics_url = "{eagle3_server.url}/metrics"\n')
    source = LiveSource(config_path=tmp_path / "nodes.toml", node="local")
    reader = InferenceMetrics(LocalHost(), f"{eagle3_server.url}/metrics")
    prompts = [p for _, p in prompts_from_tokenized(demo.tokenized, 12)]
    try:
        first_panel = source.poll_inference().snapshot
        page0 = eagle3_server.metrics()
        t0 = time.time()
        reader.parse(page0, t0)

        # a page read while requests run: a batch of 12 lasts well under a second here, so the clients go on
        # sending until a page shows one running (a single batch was missed on a loaded CI machine)
        stop = threading.Event()

        def client(prompt: list[int]) -> None:
            while not stop.is_set():
                eagle3_server.complete(prompt, 128, ignore_eos=True)

        threads = [threading.Thread(target=client, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        busy = None
        deadline = time.monotonic() + 120
        while busy is None and time.monotonic() < deadline:
            page = eagle3_server.metrics()
            if one(raw(page), "vllm:num_requests_running") > 0:
                busy = page
            time.sleep(0.02)
        stop.set()
        for t in threads:
            t.join(timeout=300)
        assert busy is not None
        live = InferenceMetrics(LocalHost(), "unused").parse(busy, time.time())
        oracle = raw(busy)
        assert live.server == "vllm"
        assert live.running_reqs == one(oracle, "vllm:num_requests_running") > 0
        assert live.queued_reqs == one(oracle, "vllm:num_requests_waiting")
        assert live.kv_cache_usage == pytest.approx(one(oracle, "vllm:kv_cache_usage_perc"))

        time.sleep(1.5)
        panel = source.poll_inference().snapshot           # what the dashboard's Inference panel draws
        page1 = eagle3_server.metrics()                    # idle: the counters do not move between the two
        t1 = time.time()
        snap = reader.parse(page1, t1)
        r0, r1 = raw(page0), raw(page1)
        d = one(r1, DRAFTS + "_total") - one(r0, DRAFTS + "_total")
        a = one(r1, ACCEPTED + "_total") - one(r0, ACCEPTED + "_total")
        dt = one(r1, "vllm:spec_decode_num_draft_tokens_total") - one(r0, "vllm:spec_decode_num_draft_tokens_total")
        gen = one(r1, "vllm:generation_tokens_total") - one(r0, "vllm:generation_tokens_total")
        assert d > 0
        for s in (snap, panel):
            assert s.error is None and s.server == "vllm"
            assert s.accept_len == pytest.approx(1 + a / d, abs=1e-9)
            assert s.accept_rate == pytest.approx(a / dt, abs=1e-9)
            assert s.per_position_acceptance == pytest.approx([
                (one(r1, ACCEPTED + "_per_pos_total", position=str(k))
                 - one(r0, ACCEPTED + "_per_pos_total", position=str(k))) / d for k in range(K)])
            assert s.running_reqs == 0 and s.queued_reqs == 0
        assert snap.gen_tokens_per_s == pytest.approx(gen / (t1 - t0))
        assert first_panel is not None and panel.gen_tokens_per_s == pytest.approx(gen / (panel.ts - first_panel.ts),
                                                                                   rel=1e-6)
    finally:
        source.close()

    # the log: vLLM's own lines (CPU KV cache usage, year-less stamps) read by nodedeck's parser, once vLLM has
    # written the idle line that closes a busy stretch (one stats interval after the last request)
    for _ in range(30):
        lines = eagle3_server.log.read_text(errors="replace").splitlines()
        engine_lines = [r for r in map(parse_log_line, lines) if r is not None and r.kind == "vllm-engine"]
        if engine_lines and engine_lines[-1].values.get("gen_tokens_per_s") == 0.0:
            break
        time.sleep(0.5)
    if record := os.environ.get("NODEDECK_ENGINE_RECORD"):        # fixtures for the fast tier
        Path(record).mkdir(parents=True, exist_ok=True)
        (Path(record) / "server.log").write_text("\n".join(lines) + "\n")
        (Path(record) / "metrics.txt").write_text(eagle3_server.metrics())
    recs = [r for r in map(parse_log_line, lines) if r is not None]
    engine = [r for r in recs if r.kind == "vllm-engine"]
    spec = [r for r in recs if r.kind == "vllm-spec"]
    assert engine and spec
    assert all(r.logged_at is not None and abs(r.logged_at - time.time()) < 3600 for r in recs)
    assert all("kv_cache_usage" in r.values for r in engine)
    total = raw(eagle3_server.metrics())
    assert sum(int(r.raw["Accepted"].split()[0]) for r in spec) == one(total, ACCEPTED + "_total")
    assert sum(int(r.raw["Drafted"].split()[0]) for r in spec) == one(total, "vllm:spec_decode_num_draft_tokens_total")
    parsed = ServerLogMetrics()
    parsed.feed(lines)
    last = parsed.snapshot()
    assert last.server == "vllm" and last.source == "log"
    assert last.running_reqs == 0 and last.gen_tokens_per_s == 0.0     # the idle line vLLM writes last
    assert last.accept_len is None      # no drafting in the latest interval: no stale acceptance shown as current

"""Inference-server telemetry: real HTTP /metrics scrapes and server log lines."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ops.errors import HostError, UserError
from ops.hosts.local import LocalHost
from ops.state import StateStore
from ops.telemetry.baseline import Baseline, load_baseline, save_baseline
from ops.telemetry.inference import InferenceMetrics, fetch_metrics, parse_samples
from ops.telemetry.serverlog import ServerLogMetrics, parse_log_line, split_fields

DATA = Path(__file__).parent / "data" / "telemetry"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class MetricsServer:
    """A tiny real HTTP server whose /metrics body the test changes between scrapes."""

    def __init__(self):
        self.body = ""
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                data = outer.body.encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/metrics"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = MetricsServer()
    yield s
    s.close()


def sglang_text(gen_total, prompt_total, running=32, queued=4, usage=0.09, accept=3.42, ranks=(0, 1)):
    lines = []
    for name, kind, value in [
        ("sglang:num_running_reqs", "gauge", running),
        ("sglang:num_queue_reqs", "gauge", queued),
        ("sglang:token_usage", "gauge", usage),
        ("sglang:gen_throughput", "gauge", 2875.12),
        ("sglang:cache_hit_rate", "gauge", 0.25),
        ("sglang:spec_accept_length", "gauge", accept),
        ("sglang:spec_accept_rate", "gauge", 0.81),
        ("sglang:generation_tokens_total", "counter", gen_total),
        ("sglang:prompt_tokens_total", "counter", prompt_total),
    ]:
        base = name.removesuffix("_total")
        lines.append(f"# HELP {base} {name} for the test server.")
        lines.append(f"# TYPE {base} {kind}")
        for r in ranks:  # every TP rank reports the replica's numbers
            lines.append(f'{name}{{engine_type="unified",model_name="{MODEL}",pp_rank="0",tp_rank="{r}"}} {value}')
    lines.append("# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.")
    lines.append("# TYPE sglang:time_to_first_token_seconds histogram")
    lines.append(f'sglang:time_to_first_token_seconds_bucket{{le="0.1",model_name="{MODEL}",tp_rank="0"}} 3.0')
    lines.append(f'sglang:time_to_first_token_seconds_bucket{{le="+Inf",model_name="{MODEL}",tp_rank="0"}} 5.0')
    lines.append(f'sglang:time_to_first_token_seconds_sum{{model_name="{MODEL}",tp_rank="0"}} 0.9')
    lines.append(f'sglang:time_to_first_token_seconds_count{{model_name="{MODEL}",tp_rank="0"}} 5.0')
    return "\n".join(lines) + "\n"


def vllm_text(engines: dict[str, dict[str, float]], old_cache_name=False):
    """engines: engine id -> counters/gauges for that engine."""
    out = []

    def fam(name, kind, key, extra=""):
        base = name.removesuffix("_total")
        out.append(f"# HELP {base} {name}")
        out.append(f"# TYPE {base} {kind}")
        for e, vals in engines.items():
            if key in vals:
                out.append(f'{name}{{engine="{e}",model_name="{MODEL}"{extra}}} {vals[key]}')
                if kind == "counter":
                    out.append(f'{base}_created{{engine="{e}",model_name="{MODEL}"{extra}}} 1.79e+09')

    fam("vllm:num_requests_running", "gauge", "running")
    fam("vllm:num_requests_waiting", "gauge", "waiting")
    fam("vllm:gpu_cache_usage_perc" if old_cache_name else "vllm:kv_cache_usage_perc", "gauge", "kv")
    fam("vllm:generation_tokens_total", "counter", "gen")
    fam("vllm:prompt_tokens_total", "counter", "prompt")
    fam("vllm:spec_decode_num_drafts_total", "counter", "drafts")
    fam("vllm:spec_decode_num_draft_tokens_total", "counter", "draft_tokens")
    fam("vllm:spec_decode_num_accepted_tokens_total", "counter", "accepted")
    fam("vllm:prefix_cache_queries_total", "counter", "queries")
    fam("vllm:prefix_cache_hits_total", "counter", "hits")
    out.append("# HELP vllm:spec_decode_num_accepted_tokens_per_pos Accepted tokens per draft position.")
    out.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
    for e, vals in engines.items():
        for pos, v in enumerate(vals.get("per_pos", [])):
            out.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total'
                       f'{{engine="{e}",model_name="{MODEL}",position="{pos}"}} {v}')
    return "\n".join(out) + "\n"


# -- SGLang over HTTP ---------------------------------------------------------------------
def test_sglang_scrapes_gauges_then_counter_rates(server):
    m = InferenceMetrics(LocalHost(), server.url)
    server.body = sglang_text(gen_total=100_000, prompt_total=50_000)
    s1 = m.parse(fetch_metrics(LocalHost(), server.url), t=1000.0)
    assert s1.server == "sglang" and s1.source == "metrics" and s1.error is None
    assert s1.gen_tokens_per_s == 2875.12  # gauge until a rate exists
    assert s1.prompt_tokens_per_s is None
    assert (s1.running_reqs, s1.queued_reqs) == (32, 4)  # rank 0 only, not doubled by tp_rank 1
    assert s1.kv_cache_usage == s1.token_usage == 0.09
    assert (s1.accept_len, s1.accept_rate, s1.prefix_cache_hit_rate) == (3.42, 0.81, 0.25)
    assert s1.model_name == MODEL
    server.body = sglang_text(gen_total=130_000, prompt_total=60_000)
    s2 = m.parse(fetch_metrics(LocalHost(), server.url), t=1010.0)
    assert s2.gen_tokens_per_s == pytest.approx(3000.0)
    assert s2.prompt_tokens_per_s == pytest.approx(1000.0)


def test_sglang_counter_reset_after_server_restart(server):
    m = InferenceMetrics(LocalHost(), server.url)
    server.body = sglang_text(gen_total=900_000, prompt_total=1)
    m.parse(fetch_metrics(LocalHost(), server.url), t=0.0)
    server.body = sglang_text(gen_total=5_000, prompt_total=1)  # restarted: counted from 0 again
    s = m.parse(fetch_metrics(LocalHost(), server.url), t=5.0)
    assert s.gen_tokens_per_s == pytest.approx(1000.0)


def test_sglang_without_speculation_has_no_accept_len(server):
    server.body = sglang_text(1, 1, accept=0.0)
    s = InferenceMetrics(LocalHost(), server.url).poll()
    assert s.accept_len is None and s.accept_rate is None


# -- vLLM ---------------------------------------------------------------------------------
def test_vllm_two_engines_rates_accept_len_and_per_position(server):
    m = InferenceMetrics(LocalHost(), server.url)
    e = {
        "0": dict(running=5, waiting=1, kv=0.40, gen=1000, prompt=500, drafts=100, draft_tokens=300, accepted=180,
                  per_pos=[80, 60, 40], queries=100, hits=10),
        "1": dict(running=3, waiting=0, kv=0.20, gen=2000, prompt=100, drafts=200, draft_tokens=600, accepted=300,
                  per_pos=[150, 100, 50], queries=100, hits=30),
    }
    server.body = vllm_text(e)
    s1 = m.parse(fetch_metrics(LocalHost(), server.url), t=100.0)
    assert s1.server == "vllm"
    assert (s1.running_reqs, s1.queued_reqs) == (8, 1)  # summed over data-parallel engines
    assert s1.kv_cache_usage == pytest.approx(0.30)
    assert s1.gen_tokens_per_s is None  # a counter needs two scrapes
    assert s1.accept_len == pytest.approx(1 + 480 / 300)  # since server start on the first scrape
    assert s1.prefix_cache_hit_rate == pytest.approx(0.2)
    e["0"].update(gen=1600, prompt=700, drafts=150, draft_tokens=450, accepted=300, per_pos=[120, 100, 80],
                  queries=200, hits=60)
    e["1"].update(gen=2400, drafts=250, draft_tokens=750, accepted=380, per_pos=[190, 130, 60])
    server.body = vllm_text(e)
    s2 = m.parse(fetch_metrics(LocalHost(), server.url), t=102.0)
    assert s2.gen_tokens_per_s == pytest.approx((600 + 400) / 2)
    assert s2.prompt_tokens_per_s == pytest.approx(100.0)
    assert s2.accept_len == pytest.approx(1 + (120 + 80) / (50 + 50))  # 1 + rate(accepted)/rate(drafts)
    assert s2.accept_rate == pytest.approx(200 / 300)
    assert s2.per_position_acceptance == pytest.approx([(40 + 40) / 100, (40 + 30) / 100, (40 + 10) / 100])
    assert s2.prefix_cache_hit_rate == pytest.approx(50 / 100)


def test_vllm_older_cache_metric_and_idle_window(server):
    e = {"0": dict(running=0, waiting=0, kv=0.05, gen=10, prompt=10, drafts=10, draft_tokens=30, accepted=15)}
    server.body = vllm_text(e, old_cache_name=True)
    m = InferenceMetrics(LocalHost(), server.url)
    assert m.poll().kv_cache_usage == 0.05
    s = m.poll()  # nothing changed: an idle interval
    assert s.gen_tokens_per_s == 0.0
    assert s.accept_len == pytest.approx(1 + 15 / 10)  # falls back to since-start, not a division by zero


def test_speedup_against_recorded_baseline(server):
    store = StateStore.for_node("gpu1")
    save_baseline(store, Baseline(tokens_per_s=1000.0, label="plain target, bench_serving c=8"))
    b = load_baseline(store)
    assert b.label.startswith("plain") and b.tokens_per_s == 1000.0
    m = InferenceMetrics(LocalHost(), server.url, baseline=b)
    server.body = sglang_text(gen_total=0, prompt_total=0)
    m.parse(server.body, t=0.0)
    s = m.parse(sglang_text(gen_total=25_000, prompt_total=0), t=10.0)
    assert s.baseline_tokens_per_s == 1000.0 and s.speedup_vs_baseline == pytest.approx(2.5)
    with pytest.raises(UserError, match="positive"):
        Baseline(tokens_per_s=0)
    store.kv_set("telemetry.baseline", {"bogus": 1})
    with pytest.raises(UserError, match="record it again"):
        load_baseline(store)
    store.close()


# -- failures are states, not exceptions, at the facade; clear errors below it ------------------
def test_missing_server_and_bad_endpoints(server):
    host = LocalHost()
    with pytest.raises(HostError, match="no inference server"):
        fetch_metrics(host, "http://127.0.0.1:9/metrics")
    server.status = 503
    with pytest.raises(HostError, match="HTTP 503"):
        fetch_metrics(host, server.url)
    server.status = 200
    server.body = "this is { not prometheus\n"
    with pytest.raises(HostError, match="Prometheus"):
        InferenceMetrics(host, server.url).poll()
    server.body = "# TYPE up gauge\nup 1\n"
    assert InferenceMetrics(host, server.url).poll().error == "no sglang: or vllm: metrics at this endpoint"


def test_remote_path_uses_curl_on_the_node(server, sshd):
    from ops.hosts.ssh import SSHHost

    host = SSHHost("testnode", "testnode", ssh_config=sshd.ssh_config)
    try:
        server.body = sglang_text(10, 10)
        m = InferenceMetrics(host, server.url)
        assert m.poll().running_reqs == 32
        with pytest.raises(HostError, match="no inference server at http://127.0.0.1:9/metrics on testnode"):
            fetch_metrics(host, "http://127.0.0.1:9/metrics")
    finally:
        host.close()


# -- server log lines ---------------------------------------------------------------------
def test_split_fields_joins_comma_lists_to_their_key():
    assert split_fields("a: 1, b: 2 x, c: 3, 4, 5, d: 6%") == [("a", "1"), ("b", "2 x"), ("c", "3, 4, 5"), ("d", "6%")]


def test_sglang_log_lines_old_and_new_formats():
    lines = (DATA / "sglang_server.log").read_text().splitlines()
    recs = [r for r in map(parse_log_line, lines) if r]
    assert [r.kind for r in recs] == ["sglang-prefill", "sglang-decode", "sglang-prefill",
                                      "sglang-decode"]  # TP1 dropped
    old = recs[1].values
    assert old == {"running_reqs": 1, "kv_cache_usage": 0.0, "accept_len": 2.91, "gen_tokens_per_s": 151.37,
                   "queued_reqs": 0}
    new = recs[3].values
    assert new["accept_rate"] == 0.81 and new["gen_tokens_per_s"] == 2875.12 and new["queued_reqs"] == 4
    assert recs[2].values["prompt_tokens_per_s"] == 10234.55
    assert recs[3].raw["cuda graph"] == "True"
    agg = ServerLogMetrics()
    assert agg.snapshot() is None
    assert agg.feed(lines) == 4
    s = agg.snapshot()
    assert s.server == "sglang" and s.source == "log"
    assert (s.running_reqs, s.queued_reqs, s.accept_len, s.gen_tokens_per_s) == (32, 4, 3.42, 2875.12)
    assert s.prompt_tokens_per_s == 10234.55


def test_sglang_hybrid_and_unknown_fields_do_not_break_parsing():
    (line,) = (DATA / "sglang_hybrid.log").read_text().splitlines()
    r = parse_log_line(line)
    assert r.values == {"running_reqs": 6, "kv_cache_usage": 0.04, "gen_tokens_per_s": 88.5, "queued_reqs": 0}
    future = ("[2027-01-01 00:00:00 DP1 TP0] Decode batch, #running-req: 3, new shiny metric: 7 widgets, "
              "token usage: 0.5, pipeline depth: 2, gen throughput (token/s): 42.0, #queue-req: 1, mystery")
    r = parse_log_line(future)
    assert r.engine == "DP1"
    assert r.values == {"running_reqs": 3, "kv_cache_usage": 0.5, "gen_tokens_per_s": 42.0, "queued_reqs": 1}
    assert r.raw["new shiny metric"] == "7 widgets"
    assert parse_log_line("[2026-09-27 09:21:05 TP0] Decode batch, accept len: not-a-number").values == {}
    assert parse_log_line('INFO:     127.0.0.1:53122 - "GET /health HTTP/1.1" 200 OK') is None


def test_vllm_engine_and_spec_decoding_lines():
    lines = (DATA / "vllm_server.log").read_text().splitlines()
    recs = [r for r in map(parse_log_line, lines) if r]
    assert [r.kind for r in recs] == ["vllm-engine", "vllm-spec", "vllm-engine"]
    e0 = recs[0].values
    assert e0 == {
        "prompt_tokens_per_s": 1520.4, "gen_tokens_per_s": 2210.7, "running_reqs": 28, "queued_reqs": 2,
        "kv_cache_usage": 0.375, "prefix_cache_hit_rate": 0.12,
    }
    spec = recs[1].values
    assert spec["accept_len"] == 2.84 and spec["accept_rate"] == pytest.approx(0.614)
    assert spec["per_position_acceptance"] == [0.812, 0.604, 0.425]
    agg = ServerLogMetrics()
    agg.feed(lines)
    s = agg.snapshot()
    assert s.server == "vllm"
    assert s.gen_tokens_per_s == pytest.approx(2210.7 + 1789.3)  # two engines
    assert s.running_reqs == 48 and s.queued_reqs == 2
    assert s.kv_cache_usage == pytest.approx(0.35)
    assert s.accept_len == 2.84 and s.per_position_acceptance == [0.812, 0.604, 0.425]


def test_vllm_v0_line_with_pending_and_trailing_period():
    r = parse_log_line((DATA / "vllm_v0.log").read_text().strip())
    assert r.values == {"prompt_tokens_per_s": 0.0, "gen_tokens_per_s": 0.0, "running_reqs": 0, "queued_reqs": 0,
                        "kv_cache_usage": 0.0}
    assert r.raw["CPU KV cache usage"] == "0.0%"


def test_parse_samples_keeps_labels():
    s = parse_samples(sglang_text(1, 2))
    assert len(s["sglang:num_running_reqs"]) == 2
    assert s["sglang:generation_tokens_total"][0][0]["tp_rank"] == "0"

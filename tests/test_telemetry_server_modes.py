"""Inference telemetry in the serving modes seen in the field: SGLang DP attention and priority
scheduling, vLLM with several engines and its older metric names (recorded pages and log lines)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.hosts.local import LocalHost
from ops.telemetry.inference import InferenceMetrics, parse_samples, total
from ops.telemetry.serverlog import ServerLogMetrics, parse_log_line

DATA = Path(__file__).parent / "data" / "telemetry"


def page(name: str) -> str:
    return (DATA / name).read_text()


def metrics(text: str, t: float = 100.0):
    return InferenceMetrics(LocalHost(), "http://127.0.0.1:1/metrics").parse(text, t)


# -- SGLang log lines under DP attention ------------------------------------------------------
def test_sglang_dp_attention_log_lines_of_every_dp_leader_are_kept():
    lines = page("sglang_dp_attention.log").splitlines()
    decode = [r for r in map(parse_log_line, lines) if r and r.kind == "sglang-decode"]
    assert [r.engine for r in decode] == ["DP0", "DP1", "DP2", "DP3"]      # global TP ranks 0, 2, 4, 6


def test_sglang_dp_attention_log_aggregates_across_dp_leaders():
    agg = ServerLogMetrics()
    agg.feed(page("sglang_dp_attention.log").splitlines())
    s = agg.snapshot()
    assert s.running_reqs == 30                                           # not 10 (DP0 alone)
    assert s.queued_reqs == 3
    assert s.gen_tokens_per_s == pytest.approx(1750.0)
    tokens = {600.0: 3.2, 400.0: 2.8, 500.0: 3.0, 250.0: 2.4}            # accept len weighted by tokens generated
    assert s.accept_len == pytest.approx(sum(g * a for g, a in tokens.items()) / 1750.0)
    assert s.kv_cache_usage == pytest.approx((0.06 + 0.05 + 0.04 + 0.03) / 4)
    assert s.prompt_tokens_per_s == pytest.approx(8100.25 + 4020.50)


def test_plain_tensor_parallel_keeps_rank_zero_only():
    agg = ServerLogMetrics()
    agg.feed([f"[2026-09-27 09:20:31 TP{tp}] Decode batch, #running-req: 4, gen throughput (token/s): 100.00, "
              "#queue-req: 0" for tp in (0, 1)])
    assert agg.snapshot().running_reqs == 4


def test_a_dp_leader_that_went_quiet_stops_counting():
    agg = ServerLogMetrics()
    agg.feed(["[2026-09-27 09:20:00 DP1 TP4 EP4] Decode batch, #running-req: 9, gen throughput (token/s): 300.00, "
              "#queue-req: 0"])
    agg.feed(["[2026-09-27 09:25:00 DP0 TP0 EP0] Decode batch, #running-req: 2, gen throughput (token/s): 80.00, "
              "#queue-req: 0"])
    s = agg.snapshot()                      # DP1 logged nothing for five minutes: it is idle, not still busy
    assert (s.running_reqs, s.gen_tokens_per_s) == (2, 80.0)


# -- SGLang /metrics with priority scheduling and DP attention ---------------------------------------
def test_sglang_priority_scheduling_totals_are_counted_once():
    samples = parse_samples(page("sglang_priority.metrics"))
    assert total(samples, "sglang:num_running_reqs") == 12.0               # not 24 (total + each priority)
    s = metrics(page("sglang_priority.metrics"))
    assert (s.running_reqs, s.queued_reqs) == (12.0, 5.0)
    assert s.gen_tokens_per_s == pytest.approx(1450.5)
    assert s.accept_len == pytest.approx(3.1)


def test_sglang_per_priority_series_alone_are_summed():
    text = "\n".join(line for line in page("sglang_priority.metrics").splitlines() if 'priority=""' not in line) + "\n"
    assert total(parse_samples(text), "sglang:num_running_reqs") == 12.0


def test_sglang_streaming_split_counters_are_summed():
    m = InferenceMetrics(LocalHost(), "http://127.0.0.1:1/metrics")
    text = page("sglang_priority.metrics")
    m.parse(text, 100.0)
    later = text.replace('is_streaming="true"} 80000.0', 'is_streaming="true"} 81000.0').replace(
        'is_streaming="false"} 20000.0', 'is_streaming="false"} 20500.0')
    assert m.parse(later, 102.0).gen_tokens_per_s == pytest.approx(1500 / 2)


def test_sglang_dp_attention_metrics_sum_the_dp_leaders():
    s = metrics(page("sglang_dp_attention.metrics"))
    assert s.running_reqs == 30.0 and s.queued_reqs == 4.0
    assert s.gen_tokens_per_s == pytest.approx(1750.0)                    # first scrape: the gauge


def test_sglang_every_scheduler_exporting_does_not_multiply_a_replica():
    """--enable-metrics-for-all-schedulers: TP ranks (each with its own EP rank) repeat the replica's numbers."""
    lines = []
    for r in range(4):
        lines.append(f'sglang:num_running_reqs{{engine_type="unified",model_name="m",moe_ep_rank="{r}",'
                     f'pp_rank="0",tp_rank="{r}"}} 6.0')
    assert total(parse_samples("# TYPE sglang:num_running_reqs gauge\n" + "\n".join(lines) + "\n"),
                 "sglang:num_running_reqs") == 6.0


# -- vLLM ----------------------------------------------------------------------------------------
def test_vllm_older_gpu_prefix_cache_names_are_read():
    s = metrics(page("vllm_old_prefix_cache.metrics"))
    assert s.prefix_cache_hit_rate == pytest.approx(500 / 2000)
    assert s.kv_cache_usage == pytest.approx(0.12)


def test_vllm_v0_prefix_cache_hit_rate_gauge_is_read():
    text = ('# TYPE vllm:gpu_prefix_cache_hit_rate gauge\n'
            'vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.42\n'
            '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 1.0\n')
    assert metrics(text).prefix_cache_hit_rate == pytest.approx(0.42)


def test_vllm_spec_decoding_line_belongs_to_the_engine_logged_just_before():
    agg = ServerLogMetrics()
    agg.feed(page("vllm_dp_spec.log").splitlines())
    s = agg.snapshot()
    # engine 000's latest SpecDecoding line (2.50) and engine 001's (3.40), weighted by tokens generated
    assert s.accept_len == pytest.approx((1800 * 2.50 + 600 * 3.40) / 2400)
    assert s.accept_rate == pytest.approx((1800 * 0.50 + 600 * 0.80) / 2400)
    assert s.per_position_acceptance == pytest.approx(
        [(1800 * a + 600 * b) / 2400 for a, b in ((0.7, 0.9), (0.5, 0.8), (0.3, 0.7))])
    assert s.gen_tokens_per_s == pytest.approx(2400.0) and s.running_reqs == 24

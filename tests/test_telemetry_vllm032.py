"""vLLM 0.32 (CPU build) as recorded from a real server in the engine tier: its log lines and its /metrics page."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ops.hosts.local import LocalHost
from ops.telemetry.inference import InferenceMetrics
from ops.telemetry.serverlog import ServerLogMetrics, parse_log_line

DATA = Path(__file__).parent / "data" / "telemetry"
LOG = (DATA / "vllm032_cpu_eagle3.log").read_text().splitlines()


def test_cpu_kv_cache_usage_is_read():
    recs = [r for r in map(parse_log_line, LOG) if r is not None and r.kind == "vllm-engine"]
    assert recs and all(any(k.endswith("KV cache usage") and k.startswith("CPU") for k in r.raw) for r in recs)
    assert all("kv_cache_usage" in r.values for r in recs)
    assert max(r.values["kv_cache_usage"] for r in recs) > 0


@pytest.mark.parametrize("device", ["GPU", "CPU", "XPU", "TPU"])
def test_kv_cache_usage_of_any_device(device):
    line = next(line for line in LOG if "Engine 000" in line).replace("CPU KV cache usage", f"{device} KV cache usage")
    r = parse_log_line(line.replace(line.split("KV cache usage: ")[1].split("%")[0], "12.5"))
    assert r.values["kv_cache_usage"] == pytest.approx(0.125)


def test_year_less_stamps_become_times():
    recs = [r for r in map(parse_log_line, LOG) if r is not None]
    assert recs and all(r.logged_at is not None for r in recs)
    first = time.localtime(recs[0].logged_at)
    assert (first.tm_mon, first.tm_mday) == (12, 4)
    assert [r.logged_at for r in recs] == sorted(r.logged_at for r in recs)


def test_a_stamp_from_december_read_in_january_is_last_year():
    line = "(APIServer pid=1) INFO 12-31 23:59:58 [loggers.py:335] Engine 000: Avg generation throughput: 5.0 tokens/s"
    from ops.telemetry import serverlog

    jan = time.mktime((2027, 1, 1, 0, 0, 5, 0, 0, -1))
    assert time.localtime(serverlog._stamp(line, jan)).tm_year == 2026
    assert parse_log_line(line).logged_at is not None


def test_reading_a_whole_log_applies_the_quiet_cutoff():
    """Lines fed all at once (a log read from the start): their own stamps, not the reading time, say which engine
    went quiet: an engine silent for minutes no longer counts."""
    busy = next(line for line in LOG if "Engine 000" in line and "Running: 0 reqs" not in line)
    old = busy.replace("Engine 000", "Engine 001")
    stamp = old.split(" INFO ")[1][:14]
    old = old.replace(stamp, "12-04 10:00:00")
    agg = ServerLogMetrics()
    agg.feed([old, *LOG])
    s = agg.snapshot()
    new = parse_log_line(LOG[max(i for i, line in enumerate(LOG) if "Engine 000" in line)])
    assert s.running_reqs == new.values["running_reqs"]           # engine 001's old numbers dropped


def test_an_idle_server_shows_no_acceptance_from_its_last_busy_interval():
    agg = ServerLogMetrics()
    agg.feed(LOG)
    s = agg.snapshot()
    assert s.gen_tokens_per_s == 0.0 and s.running_reqs == 0
    assert s.accept_len is None and s.per_position_acceptance == []
    busy = ServerLogMetrics()
    last_spec = max(i for i, line in enumerate(LOG) if "SpecDecoding metrics" in line)
    busy.feed(LOG[: last_spec + 1])
    b = busy.snapshot()
    spec = parse_log_line(LOG[last_spec])
    assert b.accept_len == spec.values["accept_len"] and b.accept_len is not None
    assert b.per_position_acceptance == spec.values["per_position_acceptance"]


def test_recorded_metrics_page():
    page = (DATA / "vllm032_cpu_eagle3.metrics").read_text()
    snap = InferenceMetrics(LocalHost(), "http://127.0.0.1:1/metrics").parse(page, 100.0)
    assert snap.server == "vllm" and snap.error is None
    assert snap.running_reqs == 0 and snap.queued_reqs == 0 and snap.kv_cache_usage == 0.0
    reader = InferenceMetrics(LocalHost(), "http://127.0.0.1:1/metrics")
    zero = "\n".join(line for line in page.splitlines() if not line.startswith("vllm:spec_decode"))
    reader.parse(zero, 100.0)
    later = reader.parse(page, 110.0)
    from prometheus_client.parser import text_string_to_metric_families

    vals = {s.name + str(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(page)
            for s in f.samples}
    drafts = next(v for k, v in vals.items() if k.startswith("vllm:spec_decode_num_drafts_total"))
    accepted = next(v for k, v in vals.items() if k.startswith("vllm:spec_decode_num_accepted_tokens_total"))
    assert drafts > 0 and later.accept_len == pytest.approx(1 + accepted / drafts)

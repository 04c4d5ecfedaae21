"""The pipeline's outcome from eval and benchmark result files and the live server, with a plain verdict."""

from __future__ import annotations

import json
import time

from cli.main import main
from ops.hosts.local import LocalHost
from ops.outcome import from_results, last_record
from ops.telemetry.snapshots import InferenceSnapshot

# one line of SGLang's benchmark --output-file (fields as its serving benchmark writes them)
BENCH = {"backend": "sglang", "dataset_name": "custom", "request_rate": "inf", "max_concurrency": 8,
         "duration": 61.2, "completed": 200, "total_input_tokens": 51200, "total_output_tokens": 40000,
         "request_throughput": 3.27, "input_throughput": 836.6, "output_throughput": 653.6,
         "mean_ttft_ms": 210.4, "mean_tpot_ms": 11.7, "concurrency": 7.8}


def test_drafter_and_baseline_benchmarks_give_the_speedup():
    o = from_results([("stage bench_baseline", {**BENCH, "accept_length": None, "output_throughput": 158.0}),
                      ("stage bench_eagle", {**BENCH, "accept_length": 3.1, "output_throughput": 373.0})])
    assert o.accept_len.value == 3.1 and o.baseline_tok_s.value == 158.0 and o.drafter_tok_s.value == 373.0
    assert round(o.speedup.value, 2) == 2.36 and not o.slower
    assert o.verdict() == "speculation is 2.36x faster than no speculation"


def test_slower_than_no_speculation_is_said_plainly():
    o = from_results([("stage bench_baseline", {**BENCH, "output_throughput": 160.0}),
                      ("stage bench_eagle", {**BENCH, "accept_length": 1.3, "output_throughput": 105.6})])
    assert o.slower and o.verdict().startswith("SPECULATION IS SLOWER than no speculation: 0.66x")


def test_eval_file_and_live_server():
    ev = {"mean_accept_len": 4.19, "untrained": {"mean_accept_len": 1.0}, "tokens_per_s": 50.0,
          "baseline_tokens_per_s": 20.0, "num_prompts": 6}
    o = from_results([("stage eval", ev)])
    assert o.lines()[0] == "acceptance length 4.19 (untrained drafter 1.00)  [stage eval]"
    assert round(o.speedup.value, 1) == 2.5
    live = InferenceSnapshot(ts=time.time(), server="sglang", accept_len=2.2, gen_tokens_per_s=300.0,
                             baseline_tokens_per_s=150.0)
    o = from_results([], live)
    assert o.accept_len.source == "live sglang server" and o.speedup.value == 2.0
    assert from_results([]).verdict().startswith("no outcome yet")


def test_last_record_reads_json_and_jsonl(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"x": 1}))
    (tmp_path / "b.jsonl").write_text(json.dumps({"x": 1}) + "\n" + json.dumps({"x": 2}) + "\n{broken")
    host = LocalHost()
    assert last_record(host, str(tmp_path / "a.json")) == {"x": 1}
    assert last_record(host, str(tmp_path / "b.jsonl")) == {"x": 2}
    assert last_record(host, str(tmp_path / "missing.json")) is None


def test_plan_outcome_cli_reads_the_stages_result_files(tmp_path, capsys):
    root = tmp_path / "work"
    (root / "bench").mkdir(parents=True)
    (root / "bench" / "base.jsonl").write_text(json.dumps({**BENCH, "output_throughput": 160.0}) + "\n")
    (root / "bench" / "spec.jsonl").write_text(json.dumps({**BENCH, "accept_length": 1.3,
                                                           "output_throughput": 105.6}) + "\n")
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{root}"\n')
    plan = tmp_path / "p.toml"
    plan.write_text('[[stage]]\nid = "bench_baseline"\ncommand = "true"\noutputs = ["bench/base.jsonl"]\n'
                    '[[stage]]\nid = "bench_eagle"\ncommand = "true"\noutputs = ["bench/spec.jsonl"]\n')
    assert main(["--config", str(cfg), "plan", "outcome", str(plan), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["slower"] and doc["speedup"]["source"] == "stage bench_eagle / stage bench_baseline"
    assert main(["--config", str(cfg), "plan", "outcome", str(plan)]) == 1
    assert "SPECULATION IS SLOWER" in capsys.readouterr().out

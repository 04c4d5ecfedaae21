"""A served acceptance that collapses raises an alert by default (issue 43 item 4): near 1 while the server speculates,
or far under the eval's, on /metrics pages recorded from vLLM 0.32 (CPU) serving the demo's drafters; it reaches
on_alert as every alert does, through `nodedeck alerts` and the node's recorded plan."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cli.main import main
from ops.alerts.records import AlertKind, Severity, Thresholds
from ops.alerts.rules import speculation
from ops.hosts.local import LocalHost
from ops.plan.parse import load_plan
from ops.run.registry import record_plan
from ops.state import StateStore
from ops.telemetry.inference import InferenceMetrics

DATA = Path(__file__).parent / "data" / "telemetry"
HEALTHY = DATA / "vllm032_cpu_eagle3.metrics"           # the demo's EAGLE-3 on 12 x 128 tokens past EOS: 1.29
COLLAPSED = DATA / "vllm032_cpu_eagle3_rotate_d2t.metrics"    # the same export, its vocab map rotated by one: 1.00


def _snap(page: Path):
    return InferenceMetrics(LocalHost(), "http://127.0.0.1:8124/metrics").parse(page.read_text(), time.time())


def test_acceptance_near_1_while_speculating_alerts_by_default():
    snap = _snap(COLLAPSED)
    assert snap.accept_len is not None and snap.accept_len <= 1.1
    [f] = speculation("gpu1", snap, Thresholds())                # no floor set, no eval known
    assert f.alert.kind is AlertKind.ACCEPT_COLLAPSED and f.alert.severity is Severity.CRITICAL
    assert f.alert.message.startswith(f"acceptance collapsed to {snap.accept_len:.2f} while speculating")
    assert f.hold_s == 60.0                                      # one quiet interval is not a collapse


def test_far_under_the_eval_alerts_and_near_it_does_not():
    snap = _snap(HEALTHY)
    assert speculation("gpu1", snap, Thresholds()) == []        # 1.29 alone is no collapse
    [f] = speculation("gpu1", snap, Thresholds(), eval_accept_len=2.42)
    assert f.alert.kind is AlertKind.ACCEPT_COLLAPSED
    assert "1.29 is far under the eval's 2.42: 0.29 drafts accepted a round against 1.42" in f.alert.message
    assert "eval 2.42" in f.alert.evidence
    assert speculation("gpu1", snap, Thresholds(), eval_accept_len=1.5) == []   # 0.29 of 0.5: over half
    assert speculation("gpu1", snap, Thresholds(min_accept_vs_eval=0.1), eval_accept_len=2.42) == []


def test_a_server_that_does_not_speculate_never_alerts():
    page = "\n".join(line for line in HEALTHY.read_text().splitlines() if "spec_decode" not in line) + "\n"
    snap = InferenceMetrics(LocalHost(), "http://x/metrics").parse(page, time.time())
    assert snap.accept_len is None and speculation("gpu1", snap, Thresholds(), eval_accept_len=3.0) == []


class _Page(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


@pytest.mark.parametrize("page,eval_len", [(COLLAPSED, None), (HEALTHY, 2.42)])
def test_the_collapse_reaches_on_alert_once(tmp_path, capsys, page, eval_len):
    handler = type("H", (_Page,), {"body": page.read_bytes()})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    fired = tmp_path / "fired.jsonl"
    root = tmp_path / "work"
    (tmp_path / "nodes.toml").write_text(
        f'[nodes.local]\nroot = "{root}"\nmetrics_url = "http://127.0.0.1:{httpd.server_port}/metrics"\n'
        f"alerts = {{ collapse_hold_s = 0 }}\non_alert = 'cat >> {fired}; echo >> {fired}'\n")
    if eval_len is not None:       # the plan run on the node evaluated the drafter: its eval.json is the line
        root.mkdir()
        (root / "eval.json").write_text(json.dumps({"mean_accept_len": eval_len, "rounds": 40}))
        plan = tmp_path / "p.toml"
        plan.write_text('[plan]\nname = "collapse-test"\n[[stage]]\nid = "evaluate"\ncommand = "true"\n'
                        'outputs = ["eval.json"]\n')
        store = StateStore.for_node("local")
        record_plan(store, load_plan(plan))
        store.close()
    try:
        for _ in range(2):
            assert main(["--config", str(tmp_path / "nodes.toml"), "alerts", "local", "--json"]) == 1
            kinds = [a["kind"] for a in json.loads(capsys.readouterr().out)["alerts"]]
            assert kinds == ["accept_collapsed"]
        deadline = time.monotonic() + 30
        while not (fired.exists() and fired.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        [doc] = [json.loads(line) for line in fired.read_text().splitlines() if line.strip()]    # once
        assert doc["kind"] == "accept_collapsed" and doc["severity"] == "critical"
        assert ("far under the eval's 2.42" in doc["message"]) == (eval_len is not None)
    finally:
        httpd.shutdown()
        httpd.server_close()

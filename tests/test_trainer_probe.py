"""`nodedeck-train probe`: a running engine's acceptance on the eval's own prompts, from vLLM's counters around each
request and SGLang's per-request meta_info, against servers on loopback that answer as the engines do (the real vLLM
runs the same step in the engine tier, tests/engines/test_vllm_train_serve.py)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trainer.probe import main
from trainer.prompts import prompts_sha256

PROMPTS = [{"id": "a", "input_ids": [1, 2, 3]}, {"id": "b", "input_ids": [4, 5]}]
# per request: (drafts, accepted per position) of a K = 3 drafter
ROUNDS = {(1, 2, 3): (4, [3, 2, 1]), (4, 5): (5, [2, 0, 0])}


class _Engine(BaseHTTPRequestHandler):
    kind = "vllm"
    counters = {"drafts": 0, "pos": [0, 0, 0]}

    def log_message(self, *a):
        pass

    def _send(self, body: bytes, ctype="application/json"):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        c = self.counters
        if self.path == "/metrics" and self.kind == "vllm":
            lines = [f"vllm:spec_decode_num_drafts_total{{model_name=\"m\"}} {c['drafts']}",
                     f"vllm:spec_decode_num_draft_tokens_total{{model_name=\"m\"}} {3 * c['drafts']}",
                     f"vllm:spec_decode_num_accepted_tokens_total{{model_name=\"m\"}} {sum(c['pos'])}"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="{i}"}} {n}'
                      for i, n in enumerate(c["pos"])]
            self._send(("\n".join(lines) + "\n").encode(), "text/plain")
        elif self.path == "/metrics":
            self._send(b"sglang:spec_accept_length{model_name=\"m\"} 2.0\n", "text/plain")
        elif self.path == "/version" and self.kind == "vllm":
            self._send(json.dumps({"version": "0.32.0+cpu"}).encode())
        elif self.path == "/get_server_info":
            self._send(json.dumps({"version": "0.5.14"}).encode())
        elif self.path == "/v1/models":
            self._send(json.dumps({"data": [{"id": "m"}]}).encode())
        else:
            self.send_error(404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        c = self.counters
        if self.path == "/v1/completions":
            assert body["temperature"] == 0.0
            drafts, pos = ROUNDS[tuple(body["prompt"])]
            c["drafts"] += drafts
            c["pos"] = [a + b for a, b in zip(c["pos"], pos)]
            self._send(json.dumps({"choices": [{"token_ids": [7] * 9}]}).encode())
        elif self.path == "/generate":
            drafts, pos = ROUNDS[tuple(body["input_ids"])]
            self._send(json.dumps({"meta_info": {"spec_verify_ct": drafts, "spec_num_correct_drafts": sum(pos),
                                                 "spec_num_proposed_drafts": 3 * drafts,
                                                 "completion_tokens": 9}}).encode())
        else:
            self.send_error(404)


@pytest.fixture(params=["vllm", "sglang"])
def engine(request):
    handler = type("Handler", (_Engine,), {"kind": request.param, "counters": {"drafts": 0, "pos": [0, 0, 0]}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield request.param, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_probe_counts_rounds_and_positions_per_request(engine, tmp_path):
    kind, url = engine
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    assert main(["--base-url", url, "--prompts", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "s.json"),
                 "--max-new-tokens", "9"]) == 0
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["server"] == kind and doc["greedy"] is True and doc["num_prompts"] == 2
    assert doc["engine"] == ({"name": "vLLM", "version": "0.32.0+cpu"} if kind == "vllm"
                             else {"name": "SGLang", "version": "0.5.14"})
    assert (doc["rounds"], doc["accepted"]) == (9, 8) and doc["served_accept_len"] == pytest.approx(1 + 8 / 9)
    assert doc["num_draft_tokens"] == 3 and doc["accept_rate"] == pytest.approx(8 / 27)
    assert [(r["id"], r["rounds"], r["accepted"]) for r in doc["per_prompt"]] == [("a", 4, 6), ("b", 5, 2)]
    # vLLM counts per position; SGLang exposes no such count
    assert doc["per_position_acceptance"] == ([5 / 9, 2 / 9, 1 / 9] if kind == "vllm" else [])
    assert doc["prompts_sha256"] == prompts_sha256([("a", [1, 2, 3]), ("b", [4, 5])])


def test_a_server_that_does_not_speculate_is_one_clear_line(tmp_path, capsys):
    (tmp_path / "p.jsonl").write_text(json.dumps(PROMPTS[0]) + "\n")
    assert main(["--base-url", "http://127.0.0.1:9", "--prompts", str(tmp_path / "p.jsonl"),
                 "--out", str(tmp_path / "s.json"), "--timeout", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("nodedeck-train: http://127.0.0.1:9:") and "\n" not in err

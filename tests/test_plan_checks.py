"""Every verify check kind against real files, a real process and a real HTTP server, on LocalHost."""

from __future__ import annotations

import http.server
import os
import subprocess
import threading
import time

import pytest

from ops.hosts.local import LocalHost
from ops.plan.records import CheckSpec
from ops.run.checks import CheckContext, run_check
from tests.support.sshd import free_port


@pytest.fixture
def ctx(tmp_path):
    return CheckContext(LocalHost(), base_dir=str(tmp_path), log_path=str(tmp_path / "run.log"))


def check(ctx, kind, **args):
    return run_check(CheckSpec(kind, args), ctx)


def test_file_exists_and_fresh(ctx, tmp_path):
    r = check(ctx, "file_exists", path="out.txt")
    assert not r.ok and r.text == "file_exists out.txt: missing ✗"
    (tmp_path / "out.txt").write_text("x")
    assert check(ctx, "file_exists", path="out.txt").ok
    # `fresh`: written before this run started does not count
    os.utime(tmp_path / "out.txt", (time.time() - 3600, time.time() - 3600))
    ctx.started_at = time.time() - 60
    r = check(ctx, "file_exists", path="out.txt", fresh=True)
    assert not r.ok and "older than this run" in r.text
    (tmp_path / "out.txt").write_text("y")
    assert check(ctx, "file_exists", path=str(tmp_path / "out.txt"), fresh=True).ok


def test_min_bytes(ctx, tmp_path):
    (tmp_path / "w.bin").write_bytes(b"\0" * 100)
    assert check(ctx, "min_bytes", path="w.bin", min=100).text == "min_bytes w.bin >= 100: 100 bytes ✓"
    assert check(ctx, "min_bytes", path="w.bin", min=101).text == "min_bytes w.bin >= 101: 100 bytes ✗"


def test_min_lines_counts_records(ctx, tmp_path):
    p = tmp_path / "data.jsonl"
    p.write_text("".join(f'{{"i": {i}}}\n' for i in range(1041)) + '{"i": 1041}')   # last line unterminated
    assert check(ctx, "min_lines", path="data.jsonl", min=1000).text == "min_lines data.jsonl >= 1000: 1042 lines ✓"
    p.write_text("")
    assert check(ctx, "min_lines", path="data.jsonl", min=1).text == "min_lines data.jsonl >= 1: 0 lines ✗"
    assert check(ctx, "min_lines", path="none.jsonl", min=1).text == "min_lines none.jsonl >= 1: missing ✗"


def test_glob_count(ctx, tmp_path):
    (tmp_path / "h").mkdir()
    for n in range(3):
        (tmp_path / "h" / f"shard-{n:05d}.safetensors").write_bytes(b"x")
    (tmp_path / "h" / "name with space.safetensors").write_bytes(b"x")
    assert check(ctx, "glob_count", pattern="h/shard-*.safetensors", min=3).text.endswith("3 matches ✓")
    assert check(ctx, "glob_count", pattern="h/*.safetensors", min=5).text.endswith("4 matches ✗")
    assert check(ctx, "glob_count", pattern="h/$(touch pwned)*", min=1).text.endswith("0 matches ✗")
    assert not (tmp_path / "pwned").exists()


def test_log_contains_only_this_runs_part(ctx, tmp_path):
    log = tmp_path / "run.log"
    log.write_text("old run: Output token throughput (tok/s): 1.0\n")
    ctx.log_offset = log.stat().st_size
    with open(log, "a") as f:
        f.write("new run: starting\n")
    r = check(ctx, "log_contains", pattern=r"Output token throughput \(tok/s\):\s+[\d.]+")
    assert not r.ok and "not found" in r.text
    with open(log, "a") as f:
        f.write("Output token throughput (tok/s):   153.2\n")
    assert check(ctx, "log_contains", pattern=r"Output token throughput \(tok/s\):\s+[\d.]+").ok
    assert check(ctx, "log_contains", pattern="old run", path=str(log)).ok   # an explicit path: whole file


def test_log_advancing(ctx, tmp_path):
    log = tmp_path / "run.log"
    assert check(ctx, "log_advancing", within=30.0).text.endswith("log missing ✗")
    log.write_text("x")
    assert check(ctx, "log_advancing", within=30.0).ok
    os.utime(log, (time.time() - 120, time.time() - 120))
    r = check(ctx, "log_advancing", within=30.0)
    assert not r.ok and "last write 120s ago" in r.text


def test_process_alive_uses_the_runner_view(ctx):
    proc = subprocess.Popen(["sleep", "30"])
    ctx.tmux_session = "demo-a"
    ctx.alive = lambda s: s == "demo-a" and proc.poll() is None
    try:
        assert check(ctx, "process_alive").text == "process_alive (this stage): demo-a alive ✓"
    finally:
        proc.kill()
        proc.wait()
    r = check(ctx, "process_alive")
    assert not r.ok and r.text == "process_alive (this stage): demo-a not running ✗"
    assert not check(ctx, "process_alive", session="other").ok


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code = 200 if self.path == "/health" else 503
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *a):
        pass


@pytest.fixture
def http_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_http_ok(ctx, http_server):
    assert check(ctx, "http_ok", url=f"{http_server}/health", timeout=5.0).text.endswith("HTTP 200 ✓")
    assert check(ctx, "http_ok", url=f"{http_server}/health_generate", timeout=5.0).text.endswith("HTTP 503 ✗")
    r = check(ctx, "http_ok", url=f"http://127.0.0.1:{free_port()}/health", timeout=2.0)
    assert not r.ok and "no answer" in r.text


def test_json_field_on_jsonl_and_json(ctx, tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_text('{"step": 1, "loss": 9.5}\n{"step": 2, "loss": 4.25}\n{"step": 3, "lo')   # a write caught midway
    assert check(ctx, "json_field", path="metrics.jsonl", field="loss", op="<", value=5, line="last").text == \
        "json_field metrics.jsonl loss < 5: 4.25 ✓"
    (tmp_path / "eval.json").write_text('{"accept_len": 4.575757575757576}')
    assert check(ctx, "json_field", path="eval.json", field="accept_len", op=">", value=2).text == \
        "json_field eval.json accept_len > 2: 4.57576 ✓"
    assert check(ctx, "json_field", path="metrics.jsonl", field="loss", op=">=", value=9.5, line="first").ok
    assert check(ctx, "json_field", path="metrics.jsonl", field="step", op="==", value=2, line=2).ok
    m.write_text('{"step": 4, "loss": NaN}\n')
    assert not check(ctx, "json_field", path="metrics.jsonl", field="loss", op="<", value=5, line="last").ok
    (tmp_path / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLMEagle3"], "eagle": {"layers": [1, 15, 28]}}')
    assert check(ctx, "json_field", path="config.json", field="architectures.0", op="==",
                 value="LlamaForCausalLMEagle3", line="last").ok
    assert check(ctx, "json_field", path="config.json", field="eagle.layers.2", op="!=", value=27, line="last").ok
    r = check(ctx, "json_field", path="config.json", field="nope", op="==", value=1, line="last")
    assert not r.ok and "no field nope" in r.text


def test_json_field_reads_only_the_tail_of_a_big_file(ctx, tmp_path):
    m = tmp_path / "big.jsonl"
    with open(m, "w") as f:
        for i in range(30000):
            f.write(f'{{"step": {i}, "loss": {10 - i / 10000:.4f}, "pad": "{"x" * 20}"}}\n')
    assert check(ctx, "json_field", path="big.jsonl", field="step", op="==", value=29999, line="last").ok


def test_command_ok(ctx):
    assert check(ctx, "command_ok", command="test -d .", timeout=10.0).text == "command_ok test -d .: exit 0 ✓"
    r = check(ctx, "command_ok", command="echo broken >&2; exit 3", timeout=10.0)
    assert not r.ok and r.text.endswith("exit 3: broken ✗")
    r = check(ctx, "command_ok", command="sleep 5", timeout=0.3)
    assert not r.ok and "timed out" in r.text


def test_command_ok_quotes_the_last_line_inert_and_cut_to_120_characters(ctx):
    r = check(ctx, "command_ok", command="printf 'x\\n\\033]52;c;aGk=\\007%0500d\\n\\n' 0 >&2; exit 3", timeout=10.0)
    said = r.text.rsplit("exit 3: ", 1)[1]
    assert not r.ok and said.startswith("\\x1b]52;c;aGk=\\x07000") and said.endswith("... ✗")
    assert len(said) == 120 + len(" ✗") and "\x1b" not in r.text

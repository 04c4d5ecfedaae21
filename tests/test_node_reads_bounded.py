"""Issue 41, items 7-10: every read from a node is bounded in bytes and time, every parse linear in what was read.

The node is the loopback sshd with the lying command first on its PATH (a probe that prints without end, a
curl that answers a /metrics page of 8,000 positions); the metrics file and the servers are the node's.
No timing asserts: the tests look at what was kept and at the work done.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest

from cli.main import main
from ops.errors import HostTimeout, OutputTooLarge
from ops.hosts import base
from ops.hosts.local import LocalHost
from ops.nodes import get_node, load_nodes, open_host
from tests.support.hostile_node import executable, lying_node_toml

FLOOD = "head -c 100M /dev/zero"
"""More than any cap on what a command's output keeps (base.MAX_OUTPUT), less than would hurt this machine."""


@pytest.fixture
def node(tmp_path, sshd):
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    (tmp_path / "home").mkdir()
    sshd.put_first_on_path(bindir, tmp_path / "home")
    cfg = lying_node_toml(tmp_path, sshd, root=str(tmp_path / "work"))
    host = open_host(get_node(load_nodes(cfg), "gpu1"))
    yield cfg, bindir, host
    host.close()


# -- 7. every command on a node: a byte cap on what is kept, and a time cap -------------------------------------
@pytest.mark.parametrize("where", ["ssh", "local"])
def test_a_command_printing_more_than_the_cap_is_stopped_keeping_at_most_the_cap(node, where):
    host = node[2] if where == "ssh" else LocalHost()
    with pytest.raises(OutputTooLarge) as e:
        host.run(["sh", "-c", FLOOD], timeout=120)
    assert len(e.value.partial_stdout) <= base.MAX_OUTPUT and "printed more than 64.0 MiB" in str(e.value)
    with pytest.raises(OutputTooLarge) as e:
        host.run(["sh", "-c", f"{FLOOD} >&2"], timeout=120, max_output=1 << 20)
    assert len(e.value.partial_stderr) <= 1 << 20 and "printed more than 1.0 MiB" in str(e.value)
    assert host.run(["sh", "-c", "head -c 3M /dev/zero"], timeout=120).stdout == bytes(3 << 20)


@pytest.mark.parametrize("where", ["ssh", "local"])
def test_a_command_without_a_timeout_still_has_one(node, where, monkeypatch):
    host = node[2] if where == "ssh" else LocalHost()
    monkeypatch.setattr(base, "MAX_COMMAND_S", 1.0)
    with pytest.raises(HostTimeout):
        host.run(["sleep", "30"], timeout=None)


@pytest.mark.parametrize("where", ["ssh", "local"])
def test_a_streamed_line_without_end_is_stopped_at_the_cap(node, where):
    host = node[2] if where == "ssh" else LocalHost()
    proc = host.open_process(["sh", "-c", f"{FLOOD}; sleep 30"], timeout=30)
    try:
        with pytest.raises(OutputTooLarge):
            for _ in range(10_000):
                proc.readline(30)
    finally:
        proc.close()


def test_node_setup_stops_a_probe_printing_without_end(node, capsys):
    cfg, bindir, _ = node
    executable(bindir / "python3", f"#!/bin/sh\n{FLOOD}\n")
    rc = main(["--config", str(cfg), "node", "setup", "gpu1", "--json"])
    out, err = capsys.readouterr()
    python = {s["step"]: s for s in json.loads(out)["steps"]}["python"]
    assert rc == 1 and python["status"] == "failed" and "printed more than 1.0 MiB" in python["detail"], out


# -- 8. training metrics: a bounded number of series, a bounded read per poll ----------------------------------
def test_a_metrics_file_with_thousands_of_keys_makes_at_most_max_series_series(node, tmp_path, capsys):
    from ops.telemetry.history import History
    from ops.telemetry.training import MAX_SERIES, POLL_BYTES, TrainingMetrics

    cfg, _, host = node
    path = tmp_path / "metrics.jsonl"
    with path.open("w") as f:
        for step in range(40):
            f.write(json.dumps({"step": step, "loss": 1.0, **{f"k{step}_{i}": i for i in range(50)}}) + "\n")
    tm = TrainingMetrics(host, str(path), history=History(100_000))
    snap = tm.poll()
    assert snap.records == 40 and len(tm.history.keys()) <= MAX_SERIES and snap.uncharted > 1000
    rc = main(["--config", str(cfg), "training", "gpu1", str(path)])
    out, err = capsys.readouterr()
    assert rc == 0 and f"past the first {MAX_SERIES} not charted" in err

    big = tmp_path / "big.jsonl"
    line = json.dumps({"step": 1, "loss": 1.0, "pad": "x" * 1000}) + "\n"
    big.write_text(line * ((POLL_BYTES + (1 << 20)) // len(line)))
    tm = TrainingMetrics(host, str(big))
    tm.poll()
    assert 0 < tm.tail.offset <= POLL_BYTES < big.stat().st_size


# -- 9. a /metrics page of 8,000 positions: work linear in the page ---------------------------------------------
def _vllm_page(positions: int) -> str:
    lines = ["# TYPE vllm:spec_decode_num_drafts_total counter",
             'vllm:spec_decode_num_drafts_total{model_name="m"} 100',
             "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
             'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 250',
             "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="{p}"}} {p % 90}'
              for p in range(positions)]
    return "\n".join(lines) + "\n"


def test_a_metrics_page_with_8000_positions_costs_work_linear_in_its_samples(node, monkeypatch, capsys):
    import ops.telemetry.inference as inference

    cfg, bindir, _ = node
    page = _vllm_page(8000)
    assert len(page) > 500_000
    (bindir / "page.txt").write_text(page)
    executable(bindir / "curl", f"#!/bin/sh\ncat {bindir}/page.txt\n")
    visited = [0]
    real = inference.grouped

    def counted(samples, name, **match):
        visited[0] += len(samples.get(name, ()))
        return real(samples, name, **match)

    monkeypatch.setattr(inference, "grouped", counted)
    rc = main(["--config", str(cfg), "metrics", "gpu1", "--url", "http://127.0.0.1:9/metrics", "--interval", "0",
               "--json"])
    out, err = capsys.readouterr()
    snap = json.loads(out)
    assert rc == 0 and len(snap["per_position_acceptance"]) == 1024 and snap["accept_len"] == 3.5
    assert snap["invalid"]["position"] == "1024"            # past the positions any drafter has
    assert visited[0] <= 20 * 8000, visited[0]               # each sample looked at a few times, not once per position


# -- 10. `metrics local` against something that is not HTTP -----------------------------------------------------
def _serve_once(answer: bytes) -> tuple[int, threading.Thread]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(answer)
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv.getsockname()[1], t


@pytest.mark.parametrize("what", ["ssh-banner", "70KB-header"])
def test_metrics_local_from_something_that_is_not_http_is_one_line(sshd, capsys, what):
    if what == "ssh-banner":
        port, t = sshd.port, None
    else:
        port, t = _serve_once(b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n")
    rc = main(["metrics", "local", "--url", f"http://127.0.0.1:{port}/metrics", "--interval", "0"])
    out, err = capsys.readouterr()
    if t is not None:
        t.join(10)
    assert rc == 2 and "Traceback" not in out + err and err.count("\n") == 1, err
    assert err.startswith(f"nodedeck: http://127.0.0.1:{port}/metrics: not a valid HTTP answer (")


def test_an_http_ok_check_on_local_against_an_ssh_banner_fails_saying_so(sshd):
    from ops.plan.records import CheckSpec
    from ops.run.checks import CheckContext, run_check

    got = run_check(CheckSpec("http_ok", {"url": f"http://127.0.0.1:{sshd.port}/health", "timeout": 5}),
                    CheckContext(LocalHost()))
    assert not got.ok and "no answer (" in got.text and "SSH-2.0" in got.text

"""Issue 31 item 3: telemetry values are checked, sizes bounded, and what is wrong said in one line.

NaN, ±Inf and negative counters are reported as invalid, never shown as numbers; a metrics page over the cap is
refused before it is parsed (here and through curl on a node); the sampler's wrongly typed answers are a HostError
naming the field; a log line without end never piles up in memory.
"""

from __future__ import annotations

import json
import re
import stat

import pytest

from cli.main import main
from ops.errors import HostError
from ops.hosts.local import LocalHost
from ops.telemetry.hoststats import raw_from_sample
from ops.telemetry.inference import MAX_METRICS_BYTES, InferenceMetrics
from ops.telemetry.sampler import gpu_snapshot
from ops.telemetry.tail import MAX_LINE, FileTail
from tests.test_telemetry_inference import MetricsServer, sglang_text


def lying_sglang() -> str:
    text = sglang_text(gen_total=100, prompt_total=50, running=float("inf"), queued=-3, usage=-5.0)
    return re.sub(r"^(sglang:spec_accept_rate\{.*\}) 0\.81$", r"\1 7",
                  re.sub(r"^(sglang:gen_throughput\{.*\}) 2875\.12$", r"\1 NaN", text, flags=re.M), flags=re.M)


def test_nan_inf_and_negative_metrics_are_invalid_not_numbers():
    snap = InferenceMetrics(LocalHost(), "http://x/metrics").parse(lying_sglang(), 1000.0)
    assert snap.gen_tokens_per_s is None and snap.running_reqs is None and snap.queued_reqs is None
    assert snap.kv_cache_usage is None and snap.accept_rate is None and snap.accept_len == pytest.approx(3.42)
    assert snap.invalid == {"gen_tokens_per_s": "nan", "running_reqs": "inf", "queued_reqs": "-3.0",
                            "kv_cache_usage": "-5.0", "accept_rate": "7.0"}


def test_a_counter_that_goes_negative_gives_no_negative_rate():
    m = InferenceMetrics(LocalHost(), "http://x/metrics")
    m.parse(sglang_text(gen_total=1000, prompt_total=10), 1000.0)
    snap = m.parse(sglang_text(gen_total=-500, prompt_total=20), 1001.0)
    assert snap.gen_tokens_per_s is None and snap.invalid["gen_tokens_per_s"] == "-500.0"


def test_metrics_cli_shows_invalid_values_as_such(capsys):
    srv = MetricsServer()
    try:
        srv.body = lying_sglang()
        rc = main(["metrics", "local", "--url", srv.url, "--interval", "0"])
        out, err = capsys.readouterr()
        assert rc == 0
        rows = {line[:19].strip(): line[19:].strip() for line in out.splitlines()[1:]}
        assert rows["generation tok/s"] == "-" and rows["running / queued"] == "- / -"
        assert rows["KV cache usage"] == "-" and rows["accept rate"] == "-"
        assert err.count("\n") == 1 and "gen_tokens_per_s nan" in err and "kv_cache_usage -5.0" in err
        rc = main(["metrics", "local", "--url", srv.url, "--interval", "0", "--json"])
        data = json.loads(capsys.readouterr().out)
        assert data["gen_tokens_per_s"] is None and data["invalid"]["running_reqs"] == "inf"
    finally:
        srv.close()


def test_an_oversized_metrics_page_is_refused_before_it_is_parsed(capsys):
    srv = MetricsServer()
    try:
        srv.body = sglang_text(gen_total=1, prompt_total=1) + "# padding\n" * (MAX_METRICS_BYTES // 10 + 1)
        rc = main(["metrics", "local", "--url", srv.url, "--interval", "0"])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and "larger than 4 MiB: not read" in err
    finally:
        srv.close()


def test_an_oversized_metrics_page_on_a_node_is_cut_on_the_node(sshd, tmp_path, capsys):
    """Through curl on the node: at most the cap (and one byte) crosses the connection."""
    srv = MetricsServer()
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.gpu1]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\nconnect_timeout = 5\n')
    try:
        srv.body = "# padding\n" * (MAX_METRICS_BYTES // 10 + 1)
        rc = main(["--config", str(cfg), "metrics", "gpu1", "--url", srv.url, "--interval", "0"])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and "on gpu1: the metrics page is larger than 4 MiB" in err
        srv.body = lying_sglang()
        rc = main(["--config", str(cfg), "metrics", "gpu1", "--url", srv.url, "--interval", "0", "--json"])
        data = json.loads(capsys.readouterr().out)
        assert rc == 0 and data["running_reqs"] is None and data["invalid"]["running_reqs"] == "inf"
    finally:
        srv.close()


def test_nvidia_smi_nan_and_negative_readings_are_invalid_not_numbers(sshd, tmp_path, capsys):
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    (tmp_path / "home").mkdir()
    rows = tmp_path / "gpus.csv"
    rows.write_text("0, GPU-1, NVIDIA H100, nan, -5, 81559, inf, 100.0, 700.0, 1980\n")
    smi = bindir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\ncase "$*" in *--query-gpu=*) cat {rows};; esac\n')
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    sshd.put_first_on_path(bindir, tmp_path / "home")
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.gpu1]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\nconnect_timeout = 5\n')
    assert main(["--config", str(cfg), "gpus", "gpu1", "--json"]) == 0
    g = json.loads(capsys.readouterr().out)["gpus"][0]
    assert g["util_pct"] is None and g["mem_used_mib"] is None and g["temp_c"] is None
    assert "invalid nan" in g["error"] and "invalid -5" in g["error"] and "invalid inf" in g["error"]


@pytest.mark.parametrize("part, words", [
    ({"gpus": [{"index": 0, "util_pct": "high"}], "processes": []}, "gpus[0].util_pct: expected a number, got str"),
    ({"gpus": "all", "processes": []}, "gpus: expected an array, got str"),
    ({"gpus": [{"index": "0"}], "processes": []}, "gpus[0].index: expected a whole number"),
    ({"gpus": [], "processes": [{"pid": 1, "command": 7}]}, "processes[0].command: expected text, got int"),
    ({"source": "nvidia-smi", "rc": "0", "out": "", "err": ""}, "rc: expected a whole number, got str"),
    ([1, 2], "expected an object, got list"),
])
def test_a_wrongly_typed_gpu_sample_names_the_field(part, words):
    with pytest.raises(HostError) as e:
        gpu_snapshot(part, 1.0)
    assert str(e.value).startswith(f"the node's sampler sent a malformed GPU sample: {words}")


def test_nan_and_negative_gpu_sample_readings_are_invalid_not_numbers():
    snap = gpu_snapshot({"gpus": [{"index": 0, "util_pct": float("nan"), "power_w": -3.0, "temp_c": 40}],
                         "processes": [{"pid": 7, "mem_mib": float("inf"), "command": "python"}]}, 1.0)
    g = snap.gpus[0]
    assert g.util_pct is None and g.power_w is None and g.temp_c == 40.0
    assert g.error == "invalid util_pct nan; invalid power_w -3.0"
    assert snap.processes[0].mem_mib is None


@pytest.mark.parametrize("part, words", [
    ({"stat": ["x", 1]}, "stat[0].v: expected a whole number >= 0, got str x"),
    ({"load": [1.0, float("nan"), 2.0]}, "load[1]: nan is not a load average"),
    ({"mem": {"MemTotal": "lots"}}, "mem.MemTotal: expected a whole number >= 0, got str"),
    ({"disks": [["/", 1, 2]]}, "disks[0]: expected [path, total, used, free]"),
    ({"disks": [["/", 1, -2, 3]]}, "disks[0].used: expected a whole number >= 0"),
])
def test_a_wrongly_typed_host_sample_names_the_field(part, words):
    with pytest.raises(HostError) as e:
        raw_from_sample(part)
    assert str(e.value).startswith(f"the node's sampler sent a malformed host sample: {words}")


def test_a_log_line_without_end_is_shown_cut_and_never_piles_up(tmp_path):
    log = tmp_path / "run.log"
    log.write_bytes(b"first\n")
    tail = FileTail(LocalHost(), str(log))
    assert tail.poll()[0] == ["first"]
    with log.open("ab") as f:
        f.write(b"x" * (3 * MAX_LINE))
    lines, _ = tail.poll()
    assert len(lines) == 1 and lines[0].startswith("x" * 100) and "more bytes of this line not shown" in lines[0]
    assert len(lines[0]) < MAX_LINE + 100
    for _ in range(3):   # the line goes on: nothing is kept of it, nothing shown again
        with log.open("ab") as f:
            f.write(b"y" * (2 * MAX_LINE))
        assert tail.poll()[0] == [] and len(tail._partial) == 0
    with log.open("ab") as f:
        f.write(b"yyy\nnext\n")
    assert tail.poll()[0] == ["next"]

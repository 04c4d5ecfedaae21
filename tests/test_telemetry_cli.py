"""`nodedeck gpus|host|metrics|training|tail|baseline` end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main
from tests.test_telemetry_inference import MetricsServer, sglang_text

NODEDECK = str(Path(sys.executable).with_name("nodedeck"))


@pytest.fixture
def nodes_toml(tmp_path, sshd):
    p = tmp_path / "nodes.toml"
    p.write_text(
        f'[nodes.gpu1]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\nwatch = ["{sshd.root}", "/"]\n'
        'metrics_url = "http://127.0.0.1:9/metrics"\nconnect_timeout = 5\n'
    )
    return str(p)


def run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_ssh_node_commands(capsys, nodes_toml, sshd):
    rc, out, _ = run(capsys, "--config", nodes_toml, "gpus", "gpu1")
    assert rc == 0 and out == "gpu1: no GPUs available (nvidia-smi not found on the node)\n"

    rc, out, err = run(capsys, "--config", nodes_toml, "host", "gpu1", "--interval", "0.05", "--json")
    data = json.loads(out)
    assert rc == 0 and data["node"] == "gpu1" and data["cpu_pct"] is not None
    assert [d["path"] for d in data["disks"]] == [str(sshd.root), "/"]

    log = sshd.root / "train.log"
    log.write_text("".join(f"step {i}\n" for i in range(100)))
    rc, out, _ = run(capsys, "--config", nodes_toml, "tail", "gpu1", str(log), "-n", "2")
    assert rc == 0 and out == "step 98\nstep 99\n"
    rc, out, _ = run(capsys, "--config", nodes_toml, "tail", "gpu1", str(log), "-n", "1", "--json")
    assert json.loads(out)["lines"] == ["step 99"]

    # the node's configured metrics_url has no server behind it: one line, exit 2
    rc, out, err = run(capsys, "--config", nodes_toml, "metrics", "gpu1")
    assert rc == 2 and err.startswith("nodedeck: no inference server at http://127.0.0.1:9/metrics on gpu1 (")
    assert err.count("\n") == 1
    rc, _, err = run(capsys, "--config", nodes_toml, "tail", "gpu1", str(sshd.root / "nope.log"))
    assert rc == 2 and "no such file" in err and err.count("\n") == 1


def test_metrics_with_baseline_and_speedup(capsys):
    srv = MetricsServer()
    try:
        srv.body = sglang_text(gen_total=0, prompt_total=0)
        rc, out, _ = run(capsys, "baseline", "local", "--set", "1000", "--label", "plain target")
        assert rc == 0 and "baseline 1000.0 tok/s" in out and "(plain target)" in out
        rc, out, _ = run(capsys, "metrics", "local", "--url", srv.url, "--interval", "0", "--json")
        data = json.loads(out)
        assert rc == 0 and data["server"] == "sglang" and data["running_reqs"] == 32
        assert data["speedup_vs_baseline"] == pytest.approx(2.87512) and data["baseline_tokens_per_s"] == 1000.0
        rc, out, _ = run(capsys, "metrics", "local", "--url", srv.url, "--interval", "0")
        assert "accept length      3.42" in out and "speedup            2.88x" in out
    finally:
        srv.close()
    rc, out, err = run(capsys, "metrics", "local")
    assert rc == 2 and "no metrics_url" in err


def test_training_as_a_subprocess(tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_text("".join(json.dumps({"step": s, "loss": 2.0 / s, "lr": 3e-4, "acc_0": 0.5, "ts": 100.0 + s}) + "\n"
                         for s in range(1, 11)) + "junk\n")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    p = subprocess.run([NODEDECK, "training", "local", str(m), "--total-steps", "100", "--json"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert (data["step"], data["skipped_lines"], data["total_steps"]) == (10, 1, 100)
    assert data["steps_per_s"] == pytest.approx(1.0) and data["eta_s"] == pytest.approx(90.0)
    p = subprocess.run([NODEDECK, "training", "local", str(m), "--total-steps", "100"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.stdout.splitlines()[0] == "step 10 / 100  loss 0.2  lr 0.0003  1.00 steps/s  eta 90s", p.stdout
    assert "(10 records, 1 malformed lines skipped)" in p.stdout


def test_tail_follow_prints_new_lines_until_interrupted(tmp_path):
    log = tmp_path / "serve.log"
    log.write_text("a\nb\n")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    proc = subprocess.Popen(
        [NODEDECK, "tail", "local", str(log), "-n", "1", "-f", "--interval", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert proc.stdout.readline() == "b\n"
        with open(log, "a") as f:
            f.write("c\nd\n")
        assert proc.stdout.readline() == "c\n" and proc.stdout.readline() == "d\n"
        log.write_text("fresh\n")  # truncated, like a restarted server's log
        assert proc.stdout.readline() == "fresh\n"
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
    assert rc == 0
    assert "file truncated or replaced" in proc.stderr.read()


def test_local_gpus_json(capsys):
    rc, out, _ = run(capsys, "gpus", "local", "--json")
    data = json.loads(out)
    assert rc == 0 and data["node"] == "local" and data["source"] == "nvml" and not data["stale"]
    assert data["available"] == bool(data["gpus"])


def test_bad_arguments_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["tail", "local", "/x", "-n", "nope"])
    assert e.value.code == 2
    assert capsys.readouterr().err == "nodedeck: error: argument -n/--lines: invalid int value: 'nope'\n"
    rc, _, err = run(capsys, "tail", "local", "/x", "-n", "-1")
    assert rc == 2 and err == "nodedeck: -n: must be 0 or more lines\n"
    rc, _, err = run(capsys, "gpus", "nosuch")
    assert rc == 2 and err.startswith("nodedeck: unknown node 'nosuch'")

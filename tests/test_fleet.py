"""The fleet: dead and slow nodes never hold up the live ones; alerts and on_alert through the CLI."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cli.main import main
from ops.alerts.rules import PreservedSummary
from ops.fleet.poller import Fleet
from ops.fleet.watch import record_decommission
from ops.nodes import NodeConfig
from ops.state import StateStore
from ops.telemetry.baseline import Baseline, save_baseline
from tests.support.sshd import SSHServer, free_port

DATA = Path(__file__).parent / "data" / "telemetry"


@pytest.fixture
def three_sshd(tmp_path_factory):
    servers = [SSHServer.create(tmp_path_factory.mktemp(f"sshd{i}")) for i in range(3)]
    for s in servers:
        s.start()
    yield servers
    for s in servers:
        s.stop()


def test_live_rows_keep_refreshing_beside_a_blackholed_and_a_closed_node(three_sshd, silent_port, tmp_path):
    nodes = [NodeConfig(f"live{i}", ssh=s.alias, ssh_config=str(s.ssh_config), root=str(tmp_path / f"r{i}"),
                        connect_timeout=3.0) for i, s in enumerate(three_sshd)]
    nodes.append(NodeConfig("blackholed", ssh="127.0.0.1", port=silent_port, connect_timeout=3.0))
    nodes.append(NodeConfig("closed", ssh="127.0.0.1", port=free_port(), connect_timeout=3.0))
    fleet = Fleet(nodes, interval=1.0, timeout=3.0)
    polls: dict[str, set[float]] = {n.name: set() for n in nodes}
    try:
        end = time.monotonic() + 12.0
        while time.monotonic() < end:
            fleet.tick()
            for s in fleet.snapshot():
                if s.polled_at:
                    polls[s.name].add(s.polled_at)
            time.sleep(0.1)
        rows = {s.name: s for s in fleet.snapshot()}
    finally:
        fleet.close()
    for i in range(3):
        row = rows[f"live{i}"]
        assert row.reachable and len(polls[f"live{i}"]) >= 2, (row, polls)
        assert row.gpus is not None and row.gpus.count == 0 and row.disk is not None
    assert rows["closed"].reachable is False and "refused" in rows["closed"].error
    assert len(polls["closed"]) <= 5                       # backing off (1, 2, 4, 8 s), not hammering
    bh = rows["blackholed"]
    assert bh.reachable is False or bh.polling or bh.reachable is None


class _Metrics(BaseHTTPRequestHandler):
    body = (DATA / "sglang_metrics_spec_slow.txt").read_bytes()

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


def test_alerts_cli_exit_1_and_on_alert_once(tmp_path, capsys):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    fired = tmp_path / "fired.txt"
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(
        f'[nodes.local]\nroot = "{tmp_path / "work"}"\n'
        f'metrics_url = "http://127.0.0.1:{httpd.server_port}/metrics"\n'
        f'cost_per_hour = 24.0\nretire_after = "2020-01-01T00:00Z"\n'
        f"on_alert = 'echo \"$NODEDECK_ALERT_KIND\" >> {fired}'\n")
    store = StateStore.for_node("local")
    save_baseline(store, Baseline(160.0))
    record_decommission(store, PreservedSummary(time.time(), True, 96, 3))
    store.close()
    try:
        for _ in range(2):
            assert main(["--config", str(cfg), "alerts", "local", "--json"]) == 1
            doc = json.loads(capsys.readouterr().out)
            kinds = sorted(a["kind"] for a in doc["alerts"])
            assert kinds == ["retire_unpreserved", "spec_slower"]
        assert sorted(fired.read_text().split()) == ["retire_unpreserved", "spec_slower"]   # once each

        assert main(["--config", str(cfg), "fleet", "--json"]) == 0
        [row] = json.loads(capsys.readouterr().out)["nodes"]
        assert row["reachable"] and row["cost"]["per_hour"] == 24.0 and row["cost"]["spent"] > 0
        assert len(row["alerts"]) == 2
        assert main(["--config", str(cfg), "fleet"]) == 0
        out = capsys.readouterr().out
        assert "speculation is slower than no speculation: 0.66x" in out and "3 of 96 files not preserved" in out
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_alerts_needs_a_node_or_all(capsys):
    assert main(["alerts"]) == 2
    assert "name one node, or give --all" in capsys.readouterr().err


def test_a_running_plan_stage_is_found_with_its_metrics_and_a_sawtooth_loss_alerts(tmp_path, capsys):
    """The plan is recorded when its stage launches; the fleet resolves the stage's ${vars} metrics path as the
    scheduler did and raises loss resets from the file the stage writes."""
    import uuid

    from ops.fleet.watch import NodeWatch
    from ops.nodes import load_nodes
    from tests.support.tmux_sessions import kill_plan_sessions

    name = f"f{uuid.uuid4().hex[:8]}"
    root = tmp_path / "work"
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{root}"\n')
    writer = ("import json,math;f=open('m/metrics.jsonl','w');"
              "[f.write(json.dumps({'step':s,'loss':1+2*math.exp(-(s%500)/166)})+chr(10)) for s in range(3000)];"
              "f.close()")
    plan = tmp_path / "p.toml"
    plan.write_text(f'[plan]\nname = "{name}"\n[vars]\nmdir = "m"\n[[stage]]\nid = "train"\n'
                    f'command = "python3 -c \\"{writer}\\" && sleep 60"\n'
                    'outputs = ["${mdir}/metrics.jsonl"]\n')
    try:
        assert main(["--config", str(cfg), "stage", "start", "train", "--plan", str(plan)]) == 0
        capsys.readouterr()
        deadline = time.monotonic() + 20
        while not (root / "m" / "metrics.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        watch = NodeWatch(load_nodes(cfg)["local"])
        try:
            status = watch.poll()
        finally:
            watch.close()
        assert status.running == (f"{name}/train",)
        assert [(p.plan, p.total) for p in status.plans] == [(name, 1)]
        [alert] = [a for a in status.alerts if a.kind.value == "loss_resets"]
        assert alert.subject == "train:loss" and "every ~500 steps" in alert.message
    finally:
        kill_plan_sessions(name)

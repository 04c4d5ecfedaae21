"""Review 2 (issue 31 item 8): `on_alert` is never lost, never holds a poll, and says when it failed;
`nodedeck alerts` does not exit 0 about a node it could not check."""

from __future__ import annotations

import json
import time

from cli.main import main
from ops.alerts.hooks import run_on_alert
from ops.alerts.records import Alert, AlertKind, Severity
from ops.alerts.tracker import AlertTracker
from ops.fleet.watch import NodeWatch
from ops.nodes import load_nodes
from tests.support.sshd import free_port

HOSTILE = "disk\x00/x\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07\nfake line\u202e\x9b\udc80"


def test_on_alert_runs_when_node_text_holds_a_nul_and_escapes(tmp_path):
    """A NUL cannot be put in an environment variable: the hook must still run, with the text escaped there
    and exact in the JSON on stdin."""
    alert = Alert("gpu1", AlertKind.DISK_FULL_BEFORE_ETA, HOSTILE, f"{HOSTILE} fills", f"path {HOSTILE}",
                  Severity.CRITICAL, since=1.0)
    env_out, json_out = tmp_path / "env.txt", tmp_path / "stdin.json"
    cmd = f'printf "%s" "$NODEDECK_ALERT_MESSAGE" > {env_out}; cat > {json_out}'
    assert run_on_alert(cmd, alert, timeout=10) is None
    shown = env_out.read_text()
    assert shown == ("disk\\x00/x\\x1b]52;c;Y3VybCBldmlsIHwgc2g=\\x07\\x0afake line\\u202e\\x9b\\udc80 fills")
    assert json.loads(json_out.read_text())["message"] == f"{HOSTILE} fills"


def _retiring_node(tmp_path, on_alert: str):
    """A local node past its retire_after with nothing preserved: a CRITICAL alert at the first poll."""
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{tmp_path / "work"}"\nretire_after = "2020-01-01T00:00Z"\n'
                   f"on_alert = {json.dumps(on_alert)}\n")
    return cfg


def test_a_hanging_on_alert_holds_neither_fleet_json_nor_alerts(tmp_path, capsys):
    cfg = _retiring_node(tmp_path, f"touch {tmp_path / 'started'}; sleep 60")
    t0 = time.monotonic()
    assert main(["--config", str(cfg), "fleet", "--json"]) == 0
    took = time.monotonic() - t0
    out, err = capsys.readouterr()
    [row] = json.loads(out)["nodes"]
    assert [a["kind"] for a in row["alerts"]] == ["retire_unpreserved"]
    assert took < 8, f"fleet --json took {took:.1f}s behind a hanging on_alert"
    assert (tmp_path / "started").exists()
    assert "on_alert for local/retire_unpreserved/node still runs" in err


def test_a_failing_on_alert_is_reported(tmp_path, capsys):
    cfg = _retiring_node(tmp_path, "echo boom >&2; exit 3")
    assert main(["--config", str(cfg), "alerts", "local"]) == 1
    err = capsys.readouterr().err
    assert "on_alert for local/retire_unpreserved/node exited 3: boom" in err


def test_a_hook_that_cannot_start_keeps_its_alert_unannounced(tmp_path):
    """A poll must not raise on a hook that cannot start, and the alert's claim must be given back so a
    later poll runs it (today the claim is taken and the hook never runs while the alert stands)."""
    cfg = _retiring_node(tmp_path, "echo \x00 never")
    watch = NodeWatch(load_nodes(cfg)["local"])
    try:
        status = watch.poll()
        [alert] = status.alerts
        assert any("could not run" in e for e in status.hook_errors), status.hook_errors
        assert AlertTracker(watch.handle.store).claim_new([alert]) == [alert]
    finally:
        watch.close()


def test_alerts_exits_non_zero_when_a_node_could_not_be_checked(tmp_path, capsys, silent_port):
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.closed]\nssh = "127.0.0.1"\nport = {free_port()}\nconnect_timeout = 2.0\n')
    assert main(["--config", str(cfg), "alerts", "closed"]) == 3
    assert "closed: unreachable" in capsys.readouterr().out
    assert main(["--config", str(cfg), "alerts", "closed", "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["checked"] is False and "closed" in doc["unreachable"]

"""Review regressions: `nodedeck alerts` must not say "no active alerts" about nodes it could not see."""

from __future__ import annotations

import json

from cli.main import main
from tests.support.sshd import free_port


def test_alerts_does_not_call_a_dead_or_silent_fleet_clear(tmp_path, capsys, silent_port):
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.closed]\nssh = "127.0.0.1"\nport = {free_port()}\nconnect_timeout = 3.0\n'
                   f'[nodes.silent]\nssh = "127.0.0.1"\nport = {silent_port}\nconnect_timeout = 3.0\n')
    assert main(["--config", str(cfg), "alerts", "--all", "--timeout", "1"]) == 3
    out = capsys.readouterr().out
    assert "closed: unreachable" in out
    assert "silent: no answer within 1s" in out
    assert "no active alerts" not in out.splitlines() and "nodes could not be checked" in out
    assert main(["--config", str(cfg), "alerts", "--all", "--timeout", "1", "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert {"closed", "silent"} <= set(doc["unreachable"])


def test_retire_after_accepts_toml_dates_and_datetimes(tmp_path):
    """`retire_after = 2026-12-05T18:00:00Z` (a TOML datetime, no quotes) is what people write."""
    from ops.nodes import load_nodes

    cfg = tmp_path / "nodes.toml"
    cfg.write_text('[nodes.a]\nssh = "h"\nretire_after = 2026-12-05T18:00:00Z\n'
                   '[nodes.b]\nssh = "h"\nretire_after = "2026-12-05T18:00Z"\n'
                   '[nodes.c]\nssh = "h"\nretire_after = 2026-12-05\n'
                   '[nodes.d]\nssh = "h"\nretire_after = "2026-12-05"\n')
    nodes = load_nodes(cfg)
    assert nodes["a"].retire_after == nodes["b"].retire_after
    assert nodes["c"].retire_after == nodes["d"].retire_after

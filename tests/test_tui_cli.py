"""`nodedeck tui`: bad input is one line and exit 2; --screenshot renders the real dashboard headless."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cli.main import main

NODEDECK = str(Path(sys.executable).parent / "nodedeck")


def test_screenshot_of_the_local_node(tmp_path, capsys):
    out = tmp_path / "shot.svg"
    metrics = tmp_path / "m.jsonl"
    metrics.write_text("".join(f'{{"step": {i}, "loss": {3 - i / 10}, "lr": 0.001}}\n' for i in range(20)))
    assert main(["tui", "--metrics", str(metrics), "--screenshot", str(out), "--size", "120x40"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    svg = out.read_text()
    assert svg.startswith("<svg") and "local" in svg
    assert "no&#160;plan&#160;loaded" in svg  # what is missing is said, not faked


def test_bad_plan_is_one_line_with_file_and_line(tmp_path):
    plan = tmp_path / "bad.toml"
    plan.write_text('[plan]\nname = "x"\n\n[[stage]]\nid = "a"\ncommand = "true"\npriority = "urgent"\n')
    p = subprocess.run([NODEDECK, "tui", "--plan", str(plan), "--screenshot", str(tmp_path / "s.svg")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"nodedeck: {plan}:7") and "priority" in lines[0]
    assert not (tmp_path / "s.svg").exists()


def test_unknown_node_and_bad_refresh_are_refused(capsys):
    assert main(["tui", "--node", "nope", "--screenshot", "/nonexistent/x.svg"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown node 'nope'" in err
    p = subprocess.run([NODEDECK, "tui", "--refresh", "0"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--refresh" in p.stderr and "Traceback" not in p.stderr

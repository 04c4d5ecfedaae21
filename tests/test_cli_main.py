"""The root of the CLI: bare `nodedeck [options]` opens the dashboard; the demo's setup."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

from cli.main import _default_to_tui, build_parser
from ops import demo
from ops.errors import UserError
from ops.nodes import load_nodes
from ops.setup.record import recorded


def test_bare_options_go_to_the_dashboard():
    commands = build_parser().commands.choices
    assert _default_to_tui([], commands) == ["tui"]
    assert _default_to_tui(["--plan", "p.toml", "--node", "gpu1"], commands) == \
        ["tui", "--plan", "p.toml", "--node", "gpu1"]
    assert _default_to_tui(["--config", "n.toml", "--plan", "p.toml"], commands) == \
        ["--config", "n.toml", "tui", "--plan", "p.toml"]
    assert _default_to_tui(["--config=n.toml"], commands) == ["--config=n.toml", "tui"]
    assert _default_to_tui(["plan", "check", "x"], commands) == ["plan", "check", "x"]
    assert _default_to_tui(["--help"], commands) == ["--help"]


def test_every_command_s_help_renders():
    """argparse expands % in help texts only when --help is asked for: a stray one crashes it there."""
    def walk(parser: argparse.ArgumentParser, path: str) -> list[str]:
        helps = [f"{path}: {parser.format_help().count(chr(10))} lines"]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    helps += walk(sub, f"{path} {name}")
        return helps

    helps = walk(build_parser(), "nodedeck")
    assert len(helps) > 40 and any(h.startswith("nodedeck decommission:") for h in helps)


def test_demo_setup_is_isolated_and_refuses_foreign_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "user-state"))
    setup = demo.prepare(tmp_path / "work", fresh=True, say=lambda m: None)
    nodes = load_nodes(setup.config)
    assert nodes["local"].root == str(tmp_path / "work")
    port = setup.plan_vars["port"]   # a free one (tests/test_demo_two_at_once.py)
    assert nodes["local"].metrics_url == (f"http://127.0.0.1:{port}/metrics",)
    assert os.environ["XDG_STATE_HOME"] == str(tmp_path / "work" / "state")
    assert setup.plan_vars == {"port": port}   # the plan finds nodedeck-train through local's recorded setup
    trainer = recorded("local")
    assert trainer is not None and Path(trainer.trainer) == Path(sys.executable).parent / "nodedeck-train"

    (tmp_path / "work" / "output.txt").write_text("kept")
    demo.prepare(tmp_path / "work", fresh=False, say=lambda m: None)   # resume keeps what is there
    assert (tmp_path / "work" / "output.txt").read_text() == "kept"

    foreign = tmp_path / "precious"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("do not delete")
    with pytest.raises(UserError, match="not a nodedeck demo dir"):
        demo.prepare(foreign, fresh=True, say=lambda m: None)
    assert (foreign / "thesis.tex").read_text() == "do not delete"


def test_output_into_a_closed_pipe_is_quiet():
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).parent / "nodedeck"
    plan = Path(__file__).resolve().parent.parent / "assets" / "plans" / "eagle3-sglang.toml"
    proc = subprocess.run(f"'{exe}' plan show '{plan}' --json | head -c 10", shell=True, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout == "{\n  \"plan\"" and proc.stderr == ""


def test_demo_summary_line(tmp_path):
    import json

    assert demo.eval_summary(tmp_path) is None
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "eval.json").write_text(json.dumps(
        {"mean_accept_len": 3.5, "num_prompts": 6, "greedy_match_rate": 1.0, "untrained": {"mean_accept_len": 1.0}}))
    assert demo.eval_summary(tmp_path) == ("EAGLE-3 drafter: acceptance length 3.50 over 6 prompts (untrained drafter "
                                           "1.00); speculative output identical to the target's greedy output: 100%")

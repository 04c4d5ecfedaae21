"""The root of the CLI: bare `nodedeck [options]` opens the dashboard; the demo's setup."""

from __future__ import annotations

import os

import pytest

from ops import demo
from ops.cli.main import _default_to_tui, build_parser
from ops.errors import UserError
from ops.nodes import load_nodes


def test_bare_options_go_to_the_dashboard():
    commands = build_parser().commands.choices
    assert _default_to_tui([], commands) == ["tui"]
    assert _default_to_tui(["--plan", "p.toml", "--node", "gpu1"], commands) == ["tui", "--plan", "p.toml", "--node", "gpu1"]
    assert _default_to_tui(["--config", "n.toml", "--plan", "p.toml"], commands) == ["--config", "n.toml", "tui", "--plan", "p.toml"]
    assert _default_to_tui(["--config=n.toml"], commands) == ["--config=n.toml", "tui"]
    assert _default_to_tui(["plan", "check", "x"], commands) == ["plan", "check", "x"]
    assert _default_to_tui(["--help"], commands) == ["--help"]


def test_demo_setup_is_isolated_and_refuses_foreign_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "user-state"))
    setup = demo.prepare(tmp_path / "work", fresh=True, say=lambda m: None)
    nodes = load_nodes(setup.config)
    assert nodes["local"].root == str(tmp_path / "work")
    assert nodes["local"].metrics_url == ("http://127.0.0.1:8123/metrics",)
    assert os.environ["XDG_STATE_HOME"] == str(tmp_path / "work" / "state")
    assert setup.plan_vars["train"].endswith("nodedeck-train")

    (tmp_path / "work" / "output.txt").write_text("kept")
    demo.prepare(tmp_path / "work", fresh=False, say=lambda m: None)   # resume keeps what is there
    assert (tmp_path / "work" / "output.txt").read_text() == "kept"

    foreign = tmp_path / "precious"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("do not delete")
    with pytest.raises(UserError, match="not a nodedeck demo dir"):
        demo.prepare(foreign, fresh=True, say=lambda m: None)
    assert (foreign / "thesis.tex").read_text() == "do not delete"

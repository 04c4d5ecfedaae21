"""A mistyped command names the closest real one, as git does (issue 39, item 12), in one line."""

from __future__ import annotations

import pytest

from cli.main import main


@pytest.mark.parametrize("argv, wanted", [
    (["nodse"], "nodes"),
    (["--work", "x", "nodse", "--check"], "nodes"),
    (["plan", "chek", "p.toml"], "check"),
    (["stage", "strat", "x", "--plan", "p.toml"], "start"),
    (["flet"], "fleet"),
])
def test_a_mistyped_command_names_the_closest_one(argv, wanted, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"did you mean '{wanted}'?" in err, err
    assert "unrecognized arguments" not in err


def test_a_word_like_no_command_gets_no_guess(capsys):
    with pytest.raises(SystemExit):
        main(["zzzzqqq"])
    err = capsys.readouterr().err
    assert err.startswith("nodedeck: error: ") and "zzzzqqq" in err and "did you mean" not in err
    assert err.count("\n") == 1


def test_options_alone_still_open_the_dashboard_parser():
    from cli.main import _default_to_tui, build_parser

    commands = build_parser().commands.choices
    assert _default_to_tui(["--plan", "p.toml"], commands) == ["tui", "--plan", "p.toml"]
    assert _default_to_tui(["--work", "w", "--node", "gpu1"], commands) == ["--work", "w", "tui", "--node", "gpu1"]
    assert _default_to_tui(["nodse"], commands) == ["nodse"]

"""cli.common: number arguments (one parser, the bound and unit each option states)."""

from __future__ import annotations

import argparse

import pytest

from cli.common import number
from cli.main import main


def _error(parse, text: str) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as exc:
        parse(text)
    return str(exc.value)


def test_number_bounds_and_messages():
    positive, seconds, wait = number(float), number(float, unit="seconds"), number(float, zero_ok=True, unit="seconds")
    assert positive("2.5") == 2.5 and number(int)("7") == 7 and wait("0") == 0.0 and seconds("0.01") == 0.01
    assert _error(positive, "0") == "must be more than 0"
    assert _error(positive, "x") == "'x' is not a number"
    assert _error(number(int), "1.5") == "'1.5' is not a number"
    assert _error(seconds, "-0.0") == "must be more than 0 seconds"
    assert _error(seconds, "soon") == "'soon' is not a number of seconds"
    assert _error(wait, "-1") == "must be 0 or more seconds"


def test_a_bad_number_is_a_one_line_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["tmux", "stop", "local", "job", "--grace", "-1"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("argument --grace: must be 0 or more seconds")


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every leaf command under parser, with its words."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for sub in subs:
        for name, p in sub.choices.items():
            yield from _commands(p, (*path, name))


def test_every_command_that_loads_a_plan_takes_the_same_plan_node_and_var_arguments():
    from cli.main import build_parser

    seen = set()
    for words, p in _commands(build_parser()):
        opts = {a.dest: a for a in p._actions}
        if "plan_file" not in opts:
            continue
        seen.add(words)
        assert {"node", "var"} <= set(opts), words
        shape = [(a.option_strings, a.metavar, a.help, a.required) for a in (opts["plan_file"], opts["node"],
                                                                            opts["var"])]
        assert shape[1:] == [(["--node"], None, "run stages without a node on this node (default: the plan's, "
                              "else local)", False),
                             (["--var"], "NAME=VALUE", "override a [vars] entry (repeatable)", False)], words
        assert shape[0] in (([], "FILE", None, True), (["--plan"], "FILE", "the plan TOML file", True)), words
    assert {("plan", "show"), ("stage", "start"), ("todo", "export"), ("todo", "audit"), ("todo", "link")} <= seen

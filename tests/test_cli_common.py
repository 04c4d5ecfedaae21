"""ops.cli.common: number arguments (one parser, the bound and unit each option states)."""

from __future__ import annotations

import argparse

import pytest

from ops.cli.common import number
from ops.cli.main import main


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

"""plan check reads a command as the node's shell will: a `${var}` is one shell word whatever its value holds
(issue 39, item 12: `out = "/tmp/nd out"` was split, and `writes /tmp/nd but nothing creates /tmp` said)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from cli.main import main
from ops.plan.lint import lint_plan
from ops.plan.parse import parse_plan


def _plan(out: str, command: str) -> str:
    return (f'[plan]\nname = "x"\n[vars]\nout = {json.dumps(out)}\n'
            f'[[stage]]\nid = "s"\ncommand = {json.dumps(command)}\n')


def _lint(text: str) -> list[str]:
    return lint_plan(parse_plan(text, "p.toml"), text, "p.toml")


def test_a_var_holding_a_space_is_one_word_to_the_path_check(tmp_path, capsys):
    text = _plan("/tmp/nd out", "mkdir -p ${out} && echo x > ${out}/f.txt && python3 x.py --output ${out}/g.txt")
    assert _lint(text) == []
    f = tmp_path / "p.toml"
    f.write_text(text)
    assert main(["plan", "check", str(f)]) == 0, capsys.readouterr().err


def test_a_var_with_a_space_still_needs_its_directory():
    problems = _lint(_plan("/tmp/nd out", "echo x > ${out}/f.txt"))
    assert len(problems) == 1 and "writes /tmp/nd out/f.txt but nothing creates /tmp/nd out" in problems[0]


def test_a_raw_var_is_read_as_the_words_it_holds():
    text = _plan("/tmp/a /tmp/b", "mkdir -p ${out:raw} && echo x > /tmp/b/f.txt")
    assert _lint(text) == []


@settings(max_examples=60, deadline=None)
@given(st.text(st.sampled_from("ab /'\"$;&|<>*"), min_size=1, max_size=12))
def test_any_value_stays_one_word(value):
    out = "/tmp/" + value
    assert _lint(_plan(out, "mkdir -p ${out} && echo x > ${out}/f.txt")) == []

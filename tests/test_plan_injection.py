"""A plan variable never runs as code on the node: values go into commands as one quoted word.

Adversarial: `--var` values with quotes, `;`, `$(...)`, spaces and newlines are run for real
(`nodedeck plan run` on the local node, through tmux and bash); no marker file may appear and
each command must see the value exactly.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.main import main
from ops.hosts.local import LocalHost
from ops.plan.parse import PlanError, parse_plan
from ops.plan.resolve import Resolver, apply_overrides
from tests.support.tmux_sessions import kill_plan_sessions

PLAN = '''
[plan]
name = "{name}"
[vars]
msg = "hello"
dir = "{root}/plain dir"
[[stage]]
id = "argv"
command = ["python3", "-c", "import sys; open('argv.txt', 'w').write(sys.argv[1])", "${{msg}}"]
outputs = ["argv.txt"]
[[stage]]
id = "text"
command = "printf %s ${{msg}} > text.txt && mkdir -p ${{dir}} && printf %s ${{msg}} > ${{dir}}/in.txt"
outputs = ["text.txt"]
verify = [{{ kind = "command_ok", command = "test -f ${{dir}}/in.txt" }}]
[[stage]]
id = "smoke"
command = ["python3", "-c", "import sys; open('smoke.txt', 'w').write(sys.argv[-1])"]
smoke_args = ["${{msg}}"]
outputs = ["smoke.txt"]
'''

HOSTILE = [
    "x'; touch MARKER; echo '",
    "x\"; touch MARKER; echo \"",
    "$(touch MARKER)",
    "`touch MARKER`",
    "a b\nc; touch MARKER",
    "${root}'$(touch MARKER)'",
]


@pytest.fixture
def sessions():
    made: list[tuple[str, list[str]]] = []
    yield made
    for plan, _stages in made:
        kill_plan_sessions(plan)


@pytest.mark.parametrize("value", HOSTILE)
def test_var_values_are_data_not_code_in_a_real_run(tmp_path, capsys, sessions, value):
    name = f"inj{uuid.uuid4().hex[:8]}"
    sessions.append((name, ["argv", "text", "smoke"]))
    root = tmp_path / "work"
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{root}"\nmax_parallel = 3\n')
    plan = tmp_path / "p.toml"
    plan.write_text(PLAN.format(name=name, root=root))
    rc = main(["--config", str(cfg), "plan", "run", str(plan), "--poll", "0.1", "--smoke-only", "--var",
               f"msg={value}"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert not list(tmp_path.rglob("MARKER")) and not list(Path.cwd().glob("MARKER"))
    expect = value.replace("${root}", str(root))   # a --var value may use the plan's variables
    assert (root / "argv.txt").read_text() == expect
    assert (root / "text.txt").read_text() == expect
    assert (root / "plain dir" / "in.txt").read_text() == expect
    assert (root / "smoke.txt").read_text() == expect


def _resolved(text_plan: str, **vars_: str):
    plan = apply_overrides(parse_plan(text_plan), vars_)
    stage = plan.stages[0]
    return Resolver(plan, stage, node_name="local", node_root="/r", run_dir="/r/.nd").stage(stage)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=30))
def test_any_value_is_one_argument_of_bash(tmp_path, value):
    """Whatever the value, bash sees it as exactly one argument, in argv and in string commands."""
    host = LocalHost()
    for form in ('["printf", "%s", "${v}"]', '"printf %s ${v}"', '"printf %s x${v}y"'):
        stage = _resolved(f'[vars]\nv = "1"\n[[stage]]\nid = "s"\ncommand = {form}\n', v=value.replace("${", "$${"))
        res = host.run(["bash", "-c", stage.command], cwd=str(tmp_path), timeout=10)
        expect = f"x{value}y" if "x${v}y" in form else value
        assert res.returncode == 0 and res.stdout == expect.encode(), (form, value, stage.command)
    assert not list(tmp_path.iterdir())


def test_raw_inserts_shell_text_and_quoted_refs_are_refused():
    stage = _resolved('[vars]\nflags = "-a -b"\n[[stage]]\nid = "s"\ncommand = "tool ${flags:raw} ${flags}"\n')
    assert stage.command == "tool -a -b '-a -b'"
    for bad in ('"echo \'${flags}\'"', "'echo \"x ${flags}\"'"):
        with pytest.raises(PlanError) as e:
            parse_plan(f'[vars]\nflags = "x"\n[[stage]]\nid = "s"\ncommand = {bad}\n', "p.toml")
        assert e.value.errors[0].startswith("p.toml:5: stage 's': command: ${flags} inside quotes")
    with pytest.raises(PlanError) as e:
        parse_plan('[vars]\nflags = "x"\n[[stage]]\nid = "s"\ncommand = ["a", "${flags:raw}"]\n', "p.toml")
    assert "${flags:raw} in an argv array" in e.value.errors[0]
    # $${x} stays a literal for the shell, also inside quotes
    stage = _resolved('[[stage]]\nid = "s"\ncommand = "echo \\"$${HOME}\\""\n')
    assert stage.command == 'echo "${HOME}"'

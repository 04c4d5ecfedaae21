"""A wrong key in nodes.toml: `nodedeck nodes` says so first and alone, one line with file:line, and
prints no table (issue 39, item 12: the node table came first, the error after it)."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from ops.nodes import load_nodes


@pytest.fixture
def typo(tmp_path):
    path = tmp_path / "nodes.toml"
    path.write_text('[nodes.gpu1]\nssh = "gpu1"\nroott = "/x"\n')
    return path


@pytest.mark.parametrize("extra", [[], ["--check"], ["--resolved"]])
def test_a_typo_is_reported_first_and_alone(typo, capsys, extra):
    assert main(["--config", str(typo), "nodes", *extra]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [f"nodedeck: {typo}:3: nodes.gpu1.roott: unknown key 'roott'; known keys: alerts, "
                                "connect_timeout, cost_per_hour, max_parallel, metrics_url, on_alert, port, "
                                "rdzv_host, retire_after, root, ssh, ssh_config, watch"]


def test_with_json_the_error_is_the_one_answer(typo, capsys):
    assert main(["--config", str(typo), "nodes", "--json"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["error"].startswith(f"{typo}:3: ") and len(err.splitlines()) == 1


def test_every_wrong_section_is_named_in_one_run(tmp_path, capsys):
    path = tmp_path / "nodes.toml"
    path.write_text('[nodes.a]\nssh = "a"\nportt = 2\n[nodes.b]\nssh = "b"\nroot = 5\n[nodes.c]\nssh = "c"\n')
    assert main(["--config", str(path), "nodes"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and [line.split(":")[2] for line in err.splitlines()] == ["3", "6"]


def test_every_error_of_a_section_at_once_in_line_order(tmp_path, capsys):
    """Issue 42 item 2: nodes.toml declared like the plan: each wrong key of a section is its own line, all in
    one run (a section stopped at its first error), and a command that names the node says how many more."""
    path = tmp_path / "nodes.toml"
    path.write_text('[nodes.a]\nssh = ""\nport = "22"\nroot = "work"\nwatchh = ["/"]\nconnect_timeout = 0\n'
                    '[nodes.b]\nssh = "b"\n')
    assert main(["--config", str(path), "nodes"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        f"nodedeck: {path}:2: nodes.a.ssh: expected a non-empty string, got ''",
        f"nodedeck: {path}:3: nodes.a.port: expected a whole number from 1 to 65535, got '22'",
        f"nodedeck: {path}:4: nodes.a.root: expected an absolute path or one starting with ~/, got 'work'",
        f"nodedeck: {path}:5: nodes.a.watchh: unknown key 'watchh'; known keys: alerts, connect_timeout, "
        "cost_per_hour, max_parallel, metrics_url, on_alert, port, rdzv_host, retire_after, root, ssh, ssh_config, "
        "watch",
        f"nodedeck: {path}:6: nodes.a.connect_timeout: expected a number of seconds > 0 and at most 3600, got 0"]
    assert main(["--config", str(path), "run", "a", "--", "true"]) == 2
    assert capsys.readouterr().err == (f"nodedeck: {path}:2: nodes.a.ssh: expected a non-empty string, got '' "
                                       f"(and 4 more in [nodes.a]: nodedeck --config {path} nodes)\n")
    nodes = load_nodes(path)
    assert nodes["b"].ssh == "b" and list(nodes.errors) == ["a"] and len(nodes.errors["a"]) == 5

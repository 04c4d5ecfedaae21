"""`plan check` reports every error of a file in one run (issue 42 item 2, issue 39 item 12): a plan with an
unknown key, an unknown dependency and an unknown engine flag needed three runs to show all three. Now the
schema errors, what spans stages, the lint findings and the nodes each are one `file:line: message` line,
sorted by line, exit 2; `--json` gives the same as records, and `plan schema` the JSON Schema they come from."""

from __future__ import annotations

import json
import re

from cli.main import main

THREE = """\
[plan]
name = "three"

[[stage]]
id = "serve"
kind = "server"
port = 30000
command = "python -m sglang.launch_server --model-path m --port 30000 --tp-sise 2"

[[stage]]
id = "bench"
depends_on = ["serv"]
command = "echo bench"
retrys = 2
"""


def test_an_unknown_key_dependency_and_flag_in_one_run(tmp_path, capsys):
    plan = tmp_path / "three.toml"
    plan.write_text(THREE)
    assert main(["plan", "check", str(plan)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert [line.split(":")[2] for line in lines] == ["8", "12", "14"], lines
    assert lines[0].startswith(f"nodedeck: {plan}:8: stage 'serve': sglang.launch_server: unknown flag --tp-sise")
    assert lines[1] == f"nodedeck: {plan}:12: stage 'bench': unknown dependency 'serv' (stages: bench, serve)"
    assert lines[2].startswith(f"nodedeck: {plan}:14: stage 'bench': unknown key 'retrys' (expected one of: ")


def test_every_schema_error_of_a_stage_and_of_the_plan_at_once(tmp_path, capsys):
    plan = tmp_path / "p.toml"
    plan.write_text('[plan]\nmax_parallel = 0\n[vars]\nx = [1]\n[[stage]]\nid = "bad id!"\ncommand = "x"\n'
                    'retries = -1\nverify = [{ kind = "min_lines", path = "a" }, { kind = "nope" }]\n'
                    '[[stage]]\nid = "b"\ncommand = "echo ${y}"\ndepends_on = ["b"]\n')
    assert main(["plan", "check", str(plan)]) == 2
    err = [line.removeprefix(f"nodedeck: {plan}:") for line in capsys.readouterr().err.splitlines()]
    assert err == [
        "2: [plan]: max_parallel must be an integer >= 1, got 0",
        "4: [vars]: x must be a string or number, got [1]",
        "6: stage #1: id must be a string of letters, digits, _ . - (at most 64), got 'bad id!'",
        "8: stage #1: retries must be an integer >= 0, got -1",
        "9: stage #1: verify[0] min_lines: min is required",
        "9: stage #1: verify[1]: unknown check kind 'nope' (known: file_exists, min_bytes, min_lines, glob_count, "
        "log_contains, log_advancing, process_alive, http_ok, json_field, command_ok)",
        "12: stage 'b': command: unknown variable ${y} (define it in [vars]; write $${...} for a literal)",
        "13: stage 'b': depends on itself",
    ]


def test_json_lists_every_finding_with_ok(tmp_path, capsys):
    plan = tmp_path / "three.toml"
    plan.write_text(THREE)
    good = tmp_path / "good.toml"
    good.write_text('[[stage]]\nid = "a"\ncommand = "true"\n')
    assert main(["plan", "check", str(good), str(plan), "--json"]) == 2
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["ok"] is False and err == ""
    assert [(f["file"], f["line"], f["severity"], f.get("stage")) for f in doc["findings"]] == [
        (str(plan), 8, "error", "serve"), (str(plan), 12, "error", "bench"), (str(plan), 14, "error", "bench")]
    assert doc["findings"][1]["message"] == "unknown dependency 'serv' (stages: bench, serve)"
    assert main(["plan", "check", str(good), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ok": True, "findings": []}


def test_a_file_that_cannot_be_read_is_one_finding(tmp_path, capsys):
    missing = tmp_path / "absent.toml"
    assert main(["plan", "check", str(missing), "--json"]) == 2
    [finding] = json.loads(capsys.readouterr().out)["findings"]
    assert finding["file"] == str(missing) and finding["line"] is None and finding["severity"] == "error"


def test_plan_schema_prints_the_json_schema_the_checks_come_from(capsys):
    assert main(["plan", "schema"]) == 0
    text = capsys.readouterr().out
    schema = json.loads(text)
    assert not re.search(r'"(gt|ge|lt|le)":', text)     # bounds in JSON Schema's own words (exclusiveMinimum, ...)
    assert schema["additionalProperties"] is False and set(schema["properties"]) == {"plan", "vars", "stage"}
    stage = schema["$defs"]["Stage"]
    assert stage["additionalProperties"] is False and "command" in stage["required"]
    assert {"retries", "verify", "smoke", "port", "nodes"} <= set(stage["properties"])

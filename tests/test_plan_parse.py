"""Plan parsing and validation: every error is one line with the right file:line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main
from ops.paths import ASSETS
from ops.plan.locate import SourceMap
from ops.plan.parse import PlanError, effective_verify, load_plan, parse_plan
from ops.plan.records import Priority, StageKind
from ops.plan.resolve import Resolver, apply_overrides, session_name
from ops.plan.schema import parse_duration

GOOD = '''\
[plan]
name = "demo"
description = "a small plan"
node = "local"
max_parallel = 2

[vars]
work = "${root}/work"
model = "/models/tiny"

[[stage]]
id = "prep"
title = "Prepare the data set, the whole title is kept however long it is"
priority = "high"
command = "nodedeck-train prep --out ${work}/data.jsonl"
outputs = ["${work}/data.jsonl"]
smoke = { args = "--max-samples 50", verify = [{ kind = "min_lines", path = "${work}/data.jsonl", min = 50 }] }
timeout = "2h"
retries = 1
env = { HF_HUB_OFFLINE = "1", N = 3 }
upload = ["local.txt:${work}/in/local.txt", { src = "b.txt", dest = "in/b.txt" }]

[[stage]]
id = "serve"
kind = "server"
command = ["python", "-m", "sglang.launch_server", "--model-path", "${model}"]
verify = [
  { kind = "http_ok", url = "http://127.0.0.1:30000/health" },
  { kind = "log_contains", pattern = "fired up" },
]

[[stage]]
id = "train"
depends_on = ["prep", "serve"]
cwd = "train"
command = "echo $${HOME} ${stage.id}"
log = "logs/train.log"

  [[stage.verify]]
  kind = "json_field"
  path = "metrics.jsonl"
  field = "loss"
  op = "<"
  value = 10

  [[stage.verify]]
  kind = "file_exists"
  path = "final/config.json"
'''


def errors_of(text: str, name: str = "p.toml") -> list[str]:
    with pytest.raises(PlanError) as ei:
        parse_plan(text.encode(), name)
    for line in ei.value.errors:
        assert "\n" not in line and line.startswith(f"{name}:")
    return ei.value.errors


def test_good_plan_parses_every_key():
    plan = parse_plan(GOOD, "demo.toml")
    assert plan.name == "demo" and plan.max_parallel == 2 and plan.node == "local"
    prep, serve, train = plan.stages
    assert prep.title.endswith("however long it is") and prep.priority is Priority.HIGH
    assert prep.timeout == 7200 and prep.retries == 1 and dict(prep.env) == {"HF_HUB_OFFLINE": "1", "N": "3"}
    assert [(u.src, u.dest) for u in prep.upload] == [("local.txt", "${work}/in/local.txt"), ("b.txt", "in/b.txt")]
    assert prep.smoke.command == "nodedeck-train prep --out ${work}/data.jsonl --max-samples 50"
    # the smoke's checks: its output written by that run, then its own verify
    assert [c.kind for c in prep.smoke.verify] == ["file_exists", "min_lines"]
    assert serve.kind is StageKind.SERVER
    assert serve.command.startswith("python -m sglang.launch_server --model-path")
    assert [c.kind for c in effective_verify(serve, False)] == ["process_alive", "http_ok", "log_contains"]
    assert train.depends_on == ("prep", "serve") and [c.kind for c in train.verify] == ["json_field", "file_exists"]
    assert train.line == 32 and train.verify[0].line == 39 and train.verify[1].line == 46


def test_resolve_substitutes_vars_and_paths():
    plan = apply_overrides(parse_plan(GOOD, "demo.toml"), {"model": "/m/other"})
    stages = {s.id: s for s in plan.stages}
    r = Resolver(plan, stages["train"], node_name="gpu1", node_root="/data/nd", run_dir="/data/nd/.runs")
    train = r.stage(stages["train"])
    assert train.cwd == "/data/nd/train"
    assert train.command == "echo ${HOME} train"
    assert train.log == "/data/nd/logs/train.log"
    assert train.verify[0].args["path"] == "/data/nd/train/metrics.jsonl"
    serve = Resolver(plan, stages["serve"], node_name="gpu1", node_root="/r", run_dir="/r/runs").stage(stages["serve"])
    assert "/m/other" in serve.command and serve.log == f"/r/runs/{session_name('demo', 'serve')}.log"
    prep = Resolver(plan, stages["prep"], node_name="gpu1", node_root="/r", run_dir="/r/runs").stage(stages["prep"])
    assert prep.upload[1].dest == "/r/in/b.txt" and prep.outputs == ("/r/work/data.jsonl",)


def test_var_override_unknown_is_an_error():
    with pytest.raises(Exception, match="no such variable"):
        apply_overrides(parse_plan(GOOD, "demo.toml"), {"nope": "1"})


def test_session_names_are_valid_and_distinct():
    names = {session_name("p", s) for s in ("a.b", "a_b", "a-b", "x" * 80)}
    assert len(names) == 4
    assert all(len(n) <= 63 and n[0].isalnum()
               and set(n) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") for n in names)


@pytest.mark.parametrize("text,line,fragment", [
    ('[plan]\nname = "x"\n[[stage]]\nid = "a"\ncommand = \n', 5, "invalid TOML"),
    ('[[stage]]\nid = "a"\ncommand = "x"\ncommnd = "y"\n', 4, "unknown key 'commnd'"),
    ('[[stage]]\nid = "a"\ncommand = "x"\n[[stage]]\nid = "a"\ncommand = "y"\n', 4, "duplicate stage id"),
    ('[[stage]]\nid = "a"\ncommand = "x"\npriority = "urgent"\n', 4, "priority must be one of"),
    ('[[stage]]\nid = "a"\ncommand = "x"\nretries = "3"\n', 4, "retries must be an integer"),
    ('[[stage]]\nid = "a"\ncommand = "x"\ndepends_on = ["zz"]\n', 4, "unknown dependency 'zz'"),
    ('[[stage]]\nid = "a"\ncommand = "x"\nverify = [\n {kind = "file_exist", path = "p"},\n]\n', 5,
     "unknown check kind"),
    ('[[stage]]\nid = "a"\ncommand = "x"\n\n[[stage.verify]]\nkind = "min_lines"\npath = "x"\n', 5, "min is required"),
    ('[[stage]]\nid = "a"\ncommand = "echo ${nope}"\n', 3, "unknown variable ${nope}"),
    ('[[stage]]\nid = "a"\ncommand = "x"\ntimeout = "soon"\n', 4, "timeout must be"),
    ('[[stage]]\nid = "a"\ncommand = "x"\nverify = [{kind = "log_contains", pattern = "("}]\n', 4, "bad regex"),
    ('[[stage]]\nid = "a"\ncommand = "x"\nverify = [{kind = "json_field", path = "m", field = "loss", op = "~", value '
     '= 1}]\n', 4, "op must be one of"),
    ('[[stage]]\nid = "a"\ncommand = "x"\nkind = "daemon"\n', 4, 'kind must be "job" or "server"'),
    ('[[stage]]\nid = "a"\ntitle = "no command"\n', 1, "command is required"),
    ('[plan]\nname = "x"\nmax_paralel = 2\n[[stage]]\nid = "a"\ncommand = "x"\n', 3, "unknown key 'max_paralel'"),
    ('[plan]\nmax_parallel = 0\n[[stage]]\nid = "a"\ncommand = "x"\n', 2, "max_parallel must be"),
    ('[plan]\nname = "x"\n', 1, "no stages"),
])
def test_errors_name_file_line_and_stage(text, line, fragment):
    errs = errors_of(text)
    assert any(e.startswith(f"p.toml:{line}:") and fragment in e for e in errs), errs


def test_cycle_is_named():
    text = '''
[[stage]]
id = "a"
command = "x"
depends_on = ["c"]
[[stage]]
id = "b"
command = "x"
depends_on = ["a"]
[[stage]]
id = "c"
command = "x"
depends_on = ["b"]
'''
    errs = errors_of(text)
    assert errs == ["p.toml:5: stage 'a': dependency cycle: a -> c -> b -> a"]


def test_not_utf8_names_the_line():
    with pytest.raises(PlanError) as ei:
        parse_plan(b'[[stage]]\nid = "a"\ncommand = "\xff"\n', "bin.toml")
    assert ei.value.errors[0].startswith("bin.toml:3: not UTF-8")


def test_stage_with_errors_in_many_places_reports_each_in_line_order():
    text = '[[stage]]\nid = "a"\ncommand = "x"\npriority = 1\nretries = -1\nfoo = 2\n'
    errs = errors_of(text)
    assert [e.split(":")[1] for e in errs] == ["4", "5", "6"]


def test_locator_skips_multiline_strings_and_comments():
    text = '''[plan]  # the plan
name = "x"
[[stage]]
id = "a"
command = """
[[stage]]
id = "fake"
kind = "server"
"""
verify = [ # comment with kind = "x"
  {kind = "file_exists", path = "a"}, {kind = "min_bytes", path = "b", min = 1},
  {kind = "file_exists", path = "c"},
]
[[stage]]
id = "b"
'''
    sm = SourceMap(text)
    assert [s.header for s in sm.stages] == [3, 14]
    assert sm.stage_key(0, "command") == 5 and sm.stage_key(0, "verify") == 10
    assert [sm.check_line(0, "", n) for n in range(3)] == [11, 11, 12]
    assert sm.stage_key(1, "id") == 15 and sm.plan_key("plan", "name") == 2


def test_durations():
    assert parse_duration("90s") == 90 and parse_duration("30m") == 1800 and parse_duration(5) == 5.0
    assert parse_duration("1.5d") == 129600 and parse_duration("0") is None and parse_duration(True) is None


def test_bundled_plans_pass_check(capsys):
    files = sorted((ASSETS / "plans").glob("*.toml"))
    assert {"eagle3-sglang.toml", "dflash.toml"} <= {f.name for f in files}
    assert main(["plan", "check", *map(str, files)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(files) and all(line.startswith("ok: ") for line in out)


def test_eagle3_plan_is_the_real_pipeline():
    plan = load_plan(ASSETS / "plans" / "eagle3-sglang.toml")
    prep = [s for s in plan.stages if s.id.startswith("prep_")]
    assert len(prep) == 10 and all(s.smoke and "--max-samples 50" in s.smoke.command for s in prep)
    assert all(not s.depends_on for s in prep)          # the ten run in parallel
    servers = [s for s in plan.stages if s.kind is StageKind.SERVER]
    assert any("--speculative-algorithm EAGLE3" in s.command for s in servers)
    train = plan.stage("train")
    assert "--mode eagle3" in train.command and "--max-steps 20" in train.smoke.command
    assert {c.kind for c in train.verify} >= {"json_field", "file_exists"}
    bench = [s for s in plan.stages if "sglang.bench_serving" in s.command]
    assert bench and all(any(c.kind == "log_contains" and "Output token throughput" in c.args["pattern"]
                             for c in s.verify) for s in bench)
    dflash = load_plan(ASSETS / "plans" / "dflash.toml")
    assert "--mode dflash" in dflash.stage("train").command
    assert any("--speculative-algorithm DFLASH" in s.command for s in dflash.stages)


def test_cli_check_errors_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[stage]]\nid = "a"\ncommand = "x"\ndepends_on = ["a"]\n')
    assert main(["plan", "check", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"nodedeck: {bad}:4: stage 'a': depends on itself"]


def test_cli_check_as_subprocess(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[stage]\n")
    exe = Path(sys.executable).parent / "nodedeck"
    p = subprocess.run([str(exe), "plan", "check", str(bad)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().startswith(f"nodedeck: {bad}:1: invalid TOML")
    good = tmp_path / "good.toml"
    good.write_text(GOOD)
    p = subprocess.run([str(exe), "plan", "check", str(good)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("ok: 3 stages")

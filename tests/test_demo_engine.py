"""`nodedeck demo --engine`: the engine choice, its plan, and the outcome naming the engine (no vLLM needed)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from cli.main import main
from ops import demo
from ops.errors import UserError
from ops.outcome import Engine, engine_in_log, from_results
from ops.plan.lint import lint_file
from ops.plan.parse import load_plan
from ops.plan.records import StageKind
from ops.plan.resolve import Resolver, apply_overrides
from tests.support.tui_fixed import FixedSource
from tests.support.tui_screens import aio, wait_polled
from tui.app import NodedeckApp
from tui.source import OutcomeView
from tui.widgets.outcome import OutcomePanel

VLLM_LOG = ("INFO 12-04 14:22:30 [api_server.py:1] vLLM server version 0.32.0+cpu, serving model /w/demo/model\n"
            "INFO 12-04 14:22:32 [loggers.py:2] Engine 000: Avg prompt throughput: 0.0 tokens/s\n")
# what `vllm bench serve --save-result` writes (the fields the outcome reads, as vLLM 0.32 names them)
VLLM_BASE = {"backend": "openai-chat", "completed": 12, "output_throughput": 95.5}
VLLM_EAGLE3 = {"backend": "openai-chat", "completed": 12, "output_throughput": 81.2,
               "spec_decode_acceptance_length": 2.61, "spec_decode_num_drafts": 300}
EVAL = {"mean_accept_len": 3.1, "untrained": {"mean_accept_len": 1.02}, "tokens_per_s": 40.0,
        "baseline_tokens_per_s": 30.0,
        "engine": {"name": "nodedeck-train eval", "version": "0.1.0 (transformers 5.24.0, torch 2.13.0+cpu)"}}


@pytest.fixture
def no_checkout_vllm(monkeypatch, tmp_path):
    monkeypatch.setattr(demo, "CHECKOUT_VLLM", tmp_path / "absent" / "bin" / "python")


def fake_vllm_env(tmp_path: Path, *, metadata: bool = True) -> Path:
    """A Python whose `vllm` package and `vllm` command exist (an empty package, its metadata, a script)."""
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    if metadata:
        (site / "vllm-0.32.0+cpu.dist-info").mkdir()
        (site / "vllm-0.32.0+cpu.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\n"
                                                                      "Version: 0.32.0+cpu\n")
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    py = bindir / "python"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    (bindir / "vllm").write_text("#!/bin/sh\n")
    return py


# -- the engine choice ----------------------------------------------------------------------
def test_auto_is_the_standin_without_a_vllm(no_checkout_vllm):
    choice = demo.choose_engine("auto", None, env={})
    assert choice.kind is demo.EngineKind.STANDIN and choice.plan == demo.DEMO_PLAN and choice.plan_vars == {}
    assert demo.choose_engine("standin", None, env={"NODEDECK_VLLM_PYTHON": "/x"}).kind is demo.EngineKind.STANDIN


def test_auto_and_vllm_take_the_named_python(no_checkout_vllm, tmp_path):
    py = fake_vllm_env(tmp_path)
    for choice in (demo.choose_engine("auto", None, env={"NODEDECK_VLLM_PYTHON": str(py)}),
                   demo.choose_engine("vllm", str(py), env={"NODEDECK_VLLM_PYTHON": "/not/this"})):
        assert choice.kind is demo.EngineKind.VLLM and choice.python == py
        assert choice.plan == demo.VLLM_PLAN and choice.plan_vars == {"vllm_bin": str(py.parent)}
    assert "--engine-python" in demo.choose_engine("vllm", str(py), env={}).why


def test_the_checkout_venv_is_found(monkeypatch, tmp_path):
    py = fake_vllm_env(tmp_path)
    monkeypatch.setattr(demo, "CHECKOUT_VLLM", py)
    assert demo.choose_engine("auto", None, env={}).python == py


@pytest.mark.parametrize("case", ["missing", "absent-file", "no-vllm", "no-metadata", "no-command"])
def test_a_missing_or_broken_vllm_is_one_line_naming_the_make_target(no_checkout_vllm, tmp_path, case):
    env: dict[str, str] = {}
    if case == "absent-file":
        env["NODEDECK_VLLM_PYTHON"] = str(tmp_path / "nothing" / "python")
    elif case == "no-vllm":
        env["NODEDECK_VLLM_PYTHON"] = sys.executable          # the test venv: no vLLM in it
    elif case == "no-metadata":
        env["NODEDECK_VLLM_PYTHON"] = str(fake_vllm_env(tmp_path, metadata=False))
    elif case == "no-command":
        py = fake_vllm_env(tmp_path)
        (py.parent / "vllm").unlink()
        env["NODEDECK_VLLM_PYTHON"] = str(py)
    with pytest.raises(UserError) as err:
        demo.choose_engine("vllm", None, env=env)
    msg = str(err.value)
    assert "\n" not in msg and "make .venv-vllm/.installed" in msg


def test_engine_python_goes_with_vllm():
    with pytest.raises(UserError, match="--engine vllm"):
        demo.choose_engine("standin", "/usr/bin/python3", env={})


def test_cli_options(no_checkout_vllm, tmp_path, capsys):
    assert main(["demo", "--engine", "vllm", "--engine-python", str(tmp_path / "none"), "--work",
                 str(tmp_path / "w")]) != 0
    err = capsys.readouterr().err
    assert "make .venv-vllm/.installed" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "w").exists()                     # refused before the work dir is made
    with pytest.raises(SystemExit):
        main(["demo", "--engine", "sglang"])
    assert "invalid choice" in capsys.readouterr().err


# -- the plan ----------------------------------------------------------------------------------
def _same(stage):
    """The stage without the line numbers of its file."""
    def checks(cs):
        return tuple(dataclasses.replace(c, line=None) for c in cs)

    smoke = stage.smoke and dataclasses.replace(stage.smoke, verify=checks(stage.smoke.verify))
    return dataclasses.replace(stage, line=None, smoke=smoke, verify=checks(stage.verify))


def test_the_vllm_plan_is_the_demo_with_vllm_serving():
    standin, vllm = load_plan(demo.DEMO_PLAN), load_plan(demo.VLLM_PLAN)
    assert vllm.name == standin.name                          # one state: a shared stage is done once
    shared = set(standin.ids) & set(vllm.ids)
    assert set(standin.ids) - shared == {"serve_target"}       # the stand-in server, and nothing else, is gone
    for sid in shared - {"regen"}:
        assert _same(vllm.stage(sid)) == _same(standin.stage(sid)), sid
    regen = vllm.stage("regen")
    assert regen.depends_on == ("prep_prompts", "serve_vllm")
    assert _same(dataclasses.replace(regen, depends_on=standin.stage("regen").depends_on)) == _same(
        standin.stage("regen"))
    servers = [s for s in vllm.stages if s.kind is StageKind.SERVER]
    assert [s.id for s in servers] == ["serve_vllm", "serve_vllm_eagle3"]
    assert all(s.command.startswith("vllm serve ${model}") and s.env["VLLM_DISABLE_LOG_LOGO"] == "1" for s in servers)
    assert "--speculative-config.method eagle3" in vllm.stage("serve_vllm_eagle3").command
    assert vllm.vars["num_draft_tokens"] == "4" and "--num-draft-tokens 4" in vllm.stage("evaluate").command
    assert not any("nodedeck-train serve" in s.command or "${train} serve" in s.command for s in vllm.stages)
    # each benchmark names the server it measures first (the outcome's engine comes from that server's log)
    assert vllm.stage("bench_baseline").depends_on[0] == "serve_vllm"
    assert vllm.stage("bench_eagle3").depends_on[0] == "serve_vllm_eagle3"
    assert lint_file(vllm, demo.VLLM_PLAN) == []


def test_the_engines_bin_goes_first_on_the_vllm_stages_path(no_checkout_vllm, tmp_path):
    py = fake_vllm_env(tmp_path)
    choice = demo.choose_engine("vllm", str(py), env={})
    plan = apply_overrides(load_plan(choice.plan), choice.plan_vars)
    for sid in ("serve_vllm", "serve_vllm_eagle3", "bench_baseline", "bench_eagle3"):
        stage = plan.stage(sid)
        r = Resolver(plan, stage, node_name="local", node_root="/w", run_dir="/w/runs")
        assert r.shell(stage.setup) == f"export PATH={py.parent}:$PATH"


# -- the outcome names its engine --------------------------------------------------------------
def test_vllm_benchmarks_give_acceptance_and_speedup_with_their_engine():
    vllm = engine_in_log(VLLM_LOG)
    assert vllm == Engine("vLLM", "0.32.0+cpu")
    o = from_results([("stage evaluate", EVAL), ("stage bench_baseline", VLLM_BASE),
                      ("stage bench_eagle3", VLLM_EAGLE3)],
                     engines={"stage bench_baseline": vllm, "stage bench_eagle3": vllm})
    assert o.accept_len.value == 2.61 and o.accept_len.engine == vllm        # the engine's count, not the eval's
    assert (o.drafter_tok_s.value, o.baseline_tok_s.value) == (81.2, 95.5) and o.slower
    assert o.speedup.engine == vllm
    assert [str(e) for e in o.engines] == ["vLLM 0.32.0+cpu",
                                           "nodedeck-train eval 0.1.0 (transformers 5.24.0, torch 2.13.0+cpu)"]
    assert o.lines()[0].startswith("acceptance length 2.61 (untrained drafter 1.02 [stage evaluate, "
                                   "nodedeck-train eval 0.1.0")
    assert o.lines()[0].endswith("[stage bench_eagle3, vLLM 0.32.0+cpu]")
    doc = o.to_json()
    assert doc["accept_len"]["engine"] == {"name": "vLLM", "version": "0.32.0+cpu"}
    assert doc["engines"][0] == "vLLM 0.32.0+cpu"
    json.dumps(doc)


def test_an_engine_is_never_guessed_and_its_text_is_shown_safely():
    assert engine_in_log("INFO starting vllm serve /m\n") is None             # a command line names nothing
    assert engine_in_log("vLLM server version 0.1\x1b]52;c;x\x07, serving") == Engine("vLLM", "0.1")
    e = Engine.from_json({"name": "evil\x1b[2J", "version": "1\u202e"})
    assert e is not None and "\x1b" not in str(e) and "\u202e" not in str(e)
    assert Engine.from_json({"name": "x"}) is None and Engine.from_json("vLLM") is None
    o = from_results([("stage bench_eagle3", VLLM_EAGLE3)])
    assert o.engines == () and o.accept_len.engine is None


class VllmOutcomeSource(FixedSource):
    def poll_outcome(self) -> OutcomeView:
        vllm = Engine("vLLM", "0.32.0+cpu")
        return OutcomeView(from_results([("stage evaluate", EVAL), ("stage bench_baseline", VLLM_BASE),
                                         ("stage bench_eagle3", VLLM_EAGLE3)],
                                        engines={"stage bench_baseline": vllm, "stage bench_eagle3": vllm}))


@aio
async def test_the_outcome_panel_says_which_engine_measured():
    app = NodedeckApp(VllmOutcomeSource(), refresh_s=3600)
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_polled(app, pilot)
        text = app.dash.query_one(OutcomePanel).text.plain
        assert "accept len 2.61" in text and "0.85×" in text
        assert "measured by vLLM 0.32.0+cpu, nodedeck-train eval 0.1.0" in text

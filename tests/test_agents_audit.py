"""An agent's "completed" claims held against what the node shows, end to end through the CLI."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from ops.agents.audit import Claim, audit
from ops.agents.links import find_item, plan_link, suggest
from ops.agents.todos import AgentItem
from ops.plan.parse import parse_plan
from ops.plan.records import Priority, StageKind
from ops.run.views import CheckResult, StageState, StageView
from tests.support.agent_lists import local_plan_with_home, write_claude, write_opencode_db
from tests.support.tmux_sessions import kill_plan_sessions

PLAN = '''
[plan]
name = "{name}"
[[stage]]
id = "prep"
title = "Prepare the data"
command = "seq 5 > rows.txt"
outputs = ["rows.txt"]
verify = [{{ kind = "min_lines", path = "rows.txt", min = 5 }}]
todo = ["prepare*data"]
[[stage]]
id = "train"
title = "Train the drafter"
command = "echo training started; exit 3"
verify = [{{ kind = "log_contains", pattern = "done" }}]
todo = ["train the"]
[[stage]]
id = "eval_accept"
title = "Measure acceptance length"
depends_on = ["train"]
command = "echo eval"
smoke_args = "--small"
verify = [{{ kind = "log_contains", pattern = "eval" }}]
[[stage]]
id = "notes"
title = "Notes without checks"
command = "true"
'''

CLAIMS = [
    {"content": "Prepare the ShareGPT data", "status": "completed"},            # verified
    {"content": "Train the EAGLE-3 drafter", "status": "completed"},            # contradicted: it died
    {"content": "Write the report", "status": "completed"},                     # unbacked: no stage
    {"content": "Evaluate acceptance length (eval accept)", "status": "in_progress"},  # contradicted, no smoke
    {"content": "Look at the results", "status": "pending"},                    # unlinked
    {"content": "Take notes", "status": "completed"},                           # unbacked once linked: no checks
]


@pytest.fixture
def setup(tmp_path, monkeypatch):
    name, home, cfg, plan, root = local_plan_with_home(tmp_path, monkeypatch, PLAN, prefix="a",
                                                       node_extra="max_parallel = 4\n")
    write_claude(home, "s1", CLAIMS)
    yield cfg, plan, root
    kill_plan_sessions(name)


def _audit(cfg, plan, capsys):
    code = main(["--config", str(cfg), "todo", "audit", "--plan", str(plan), "--agent", "claude", "--json"])
    doc = json.loads(capsys.readouterr().out)
    return code, {i["position"]: i for i in doc["items"]}, doc


def test_claims_verified_contradicted_unbacked_through_the_cli(setup, capsys):
    cfg, plan, root = setup
    assert main(["--config", str(cfg), "plan", "run", str(plan), "--poll", "0.1"]) == 1   # train dies
    capsys.readouterr()
    assert main(["--config", str(cfg), "todo", "link", "#6", "notes", "--plan", str(plan), "--agent", "claude"]) == 0
    capsys.readouterr()

    code, items, doc = _audit(cfg, plan, capsys)
    assert code == 1 and not doc["ok"]
    assert items[1]["claim"] == "verified" and items[1]["stage"] == "prep" and items[1]["linked_by"] == "plan"
    assert items[2]["claim"] == "contradicted" and "stage train is failed" in items[2]["reason"]
    assert items[3]["claim"] == "unbacked" and items[3]["stage"] is None
    assert items[4]["claim"] == "unlinked" and items[4]["suggested_stage"] == "eval_accept"
    assert items[5]["claim"] == "unlinked"
    assert items[6]["claim"] == "unbacked" and items[6]["linked_by"] == "explicit"
    assert "no verify checks" in items[6]["reason"]

    # the suggestion is only shown; linking it makes the in-progress claim checkable
    assert main(["--config", str(cfg), "todo", "link", "eval accept", "eval_accept", "--plan", str(plan),
                 "--agent", "claude"]) == 0
    capsys.readouterr()
    _, items, _ = _audit(cfg, plan, capsys)
    assert items[4]["claim"] == "contradicted" and "blocked" in items[4]["reason"]
    assert items[4]["smoke_missing"] and "smoke run of eval_accept never verified" in items[4]["reason"]

    # the output the claim stood on disappears: verified becomes contradicted, naming the failing check
    (root / "rows.txt").unlink()
    code, items, _ = _audit(cfg, plan, capsys)
    assert items[1]["claim"] == "contradicted" and "rows.txt" in items[1]["reason"] and "✗" in items[1]["reason"]

    assert main(["--config", str(cfg), "todo", "audit", "--plan", str(plan), "--agent", "claude"]) == 1
    out = capsys.readouterr().out
    assert "CONTRADICTED" in out and "SMOKE RUN MISSING" in out and "Train the EAGLE-3 drafter" in out


def test_link_errors_are_one_line(setup, capsys):
    cfg, plan, _ = setup
    args = ["--config", str(cfg), "todo", "link"]
    assert main([*args, "#99", "prep", "--plan", str(plan), "--agent", "claude"]) == 2
    assert "no item #99" in capsys.readouterr().err
    assert main([*args, "the", "prep", "--plan", str(plan), "--agent", "claude"]) == 2
    assert "matches 4 items" in capsys.readouterr().err
    assert main([*args, "#1", "nope", "--plan", str(plan), "--agent", "claude"]) == 2
    assert "has no stage 'nope'" in capsys.readouterr().err


def _view(sid, state, *, checks=(), has_smoke=False, smoke_verified=False, smoke=False):
    return StageView(sid, sid, Priority.MEDIUM, (), StageKind.JOB, "local", state, "", tuple(checks),
                     has_smoke=has_smoke, smoke_verified=smoke_verified, smoke=smoke)


def test_smoke_before_scale_is_flagged_only_for_the_full_run():
    plan = parse_plan('[[stage]]\nid = "train"\ncommand = "x"\nsmoke_args = "--n 50"\ntodo = ["train"]\n'
                      'verify = [{ kind = "log_contains", pattern = "ok" }]\n', "p.toml")
    item = AgentItem(1, "Train on 10K samples", "in_progress")
    smoke_run = _view("train", StageState.RUNNING, has_smoke=True, smoke=True)
    full_run = _view("train", StageState.RUNNING, has_smoke=True, smoke=False)
    after_smoke = _view("train", StageState.RUNNING, has_smoke=True, smoke_verified=True)
    assert not audit([item], plan.stages, {"train": smoke_run}, {}).items[0].smoke_missing
    flagged = audit([item], plan.stages, {"train": full_run}, {})
    assert flagged.items[0].smoke_missing and not flagged.ok and flagged.items[0].claim is Claim.AGREES
    assert audit([item], plan.stages, {"train": after_smoke}, {}).ok


def test_a_completed_claim_uses_a_fresh_check_when_asked():
    plan = parse_plan('[[stage]]\nid = "prep"\ncommand = "x"\ntodo = ["prep"]\n'
                      'verify = [{ kind = "file_exists", path = "a" }]\n', "p.toml")
    ok = CheckResult("file_exists", True, "file_exists a: file ✓", 0.0)
    bad = CheckResult("file_exists", False, "file_exists a: missing ✗", 1.0)
    item = AgentItem(1, "prep done", "completed")
    views = {"prep": _view("prep", StageState.COMPLETED, checks=[ok])}
    assert audit([item], plan.stages, views, {}).items[0].claim is Claim.VERIFIED
    rechecked = audit([item], plan.stages, views, {}, recheck=lambda sid: _view(sid, StageState.FAILED, checks=[bad]))
    assert rechecked.items[0].claim is Claim.CONTRADICTED and "missing ✗" in rechecked.items[0].reason


def test_links_patterns_and_suggestions():
    plan = parse_plan('[[stage]]\nid = "hidden_states"\ntitle = "Extract hidden states"\ncommand = "x"\n'
                      'todo = ["hidden*states", "extract"]\n'
                      '[[stage]]\nid = "vocab"\ntitle = "Build the draft vocab mapping"\n'
                      'command = "nodedeck-train vocab"\n',
                      "p.toml")
    hidden = AgentItem(1, "Extract the HIDDEN   states (9 TB)", "pending")
    assert plan_link(hidden, plan.stages).pattern == "hidden*states"
    assert plan_link(AgentItem(1, "build vocab", "pending"), plan.stages) is None
    hint = suggest(AgentItem(1, "Build the d2t vocab mapping", "pending"), plan.stages)
    assert hint.stage_id == "vocab" and "vocab" in hint.words
    assert suggest(AgentItem(1, "Lunch", "pending"), plan.stages) is None
    items = [AgentItem(1, "alpha one", "pending"), AgentItem(2, "alpha two", "pending")]
    assert find_item(items, "#2").content == "alpha two" and find_item(items, "ALPHA  ONE").position == 1


def test_a_stage_that_never_ran_says_it_never_ran():
    plan = parse_plan('[[stage]]\nid = "prep_native"\ncommand = "x"\ntodo = ["prep"]\n'
                      'verify = [{ kind = "file_exists", path = "a" }]\n'
                      '[[stage]]\nid = "train"\ncommand = "x"\ndepends_on = ["prep_native"]\ntodo = ["train"]\n'
                      'verify = [{ kind = "file_exists", path = "b" }]\n', "p.toml")
    views = {"prep_native": StageView("prep_native", "", Priority.MEDIUM, (), StageKind.JOB, "local",
                                      StageState.READY, "ready"),
             "train": StageView("train", "", Priority.MEDIUM, ("prep_native",), StageKind.JOB, "local",
                                StageState.PENDING, "waiting for prep_native")}
    items = [AgentItem(1, "prep done", "completed"), AgentItem(2, "train it", "in_progress")]
    done, going = audit(items, plan.stages, views, {}).items
    assert done.claim is Claim.CONTRADICTED and done.reason == "stage prep_native never ran (ready to start)"
    assert going.claim is Claim.CONTRADICTED
    assert going.reason == "claimed in progress, but stage train never ran (pending: waiting for prep_native)"
    ran = {**views, "prep_native": StageView("prep_native", "", Priority.MEDIUM, (), StageKind.JOB, "local",
                                             StageState.READY, "smoke verified; full run next", started_at=5.0)}
    assert "never ran" not in audit(items[:1], plan.stages, ran, {}).items[0].reason


def test_words_outside_nodedecks_are_kept_and_only_completed_is_a_completion_claim(setup, capsys):
    cfg, plan, root = setup
    home = root.parent / "home"
    write_opencode_db(home, "ses_words", [
        {"content": "Prepare the ShareGPT data", "status": "blocked", "priority": "urgent"},
        {"content": "Train the EAGLE-3 drafter", "status": "\x1b]52;c;evil\x07done", "priority": "high"}])
    code = main(["--config", str(cfg), "todo", "audit", "--plan", str(plan), "--agent", "opencode", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["ok"]
    first, second = doc["items"]
    assert (first["status"], first["priority"], first["claim"]) == ("blocked", "urgent", "agrees")
    assert second["claim"] == "agrees" and second["status"] == "\x1b]52;c;evil\x07done"
    assert main(["--config", str(cfg), "todo", "audit", "--plan", str(plan), "--agent", "opencode"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b]52" in out and "blocked; stage prep is ready" not in out


def test_the_audit_shows_the_agents_dependency_graph_beside_the_plans(capsys):
    from cli.todo_agents import print_report
    from ops.agents.todos import Agent, AgentList

    plan = parse_plan('[[stage]]\nid = "prep"\ncommand = "x"\ntodo = ["prepare"]\n'
                      '[[stage]]\nid = "train"\ncommand = "x"\ndepends_on = ["prep"]\ntodo = ["train"]\n', "p.toml")
    items = (AgentItem(1, "Prepare the data", "completed", id="1", blocks=("2",)),
             AgentItem(2, "Train the drafter", "in_progress", id="2", blocked_by=("1", "7")))
    views = {"prep": _view("prep", StageState.READY), "train": _view("train", StageState.PENDING)}
    lst = AgentList(Agent.CLAUDE, "s", "/h/.claude/tasks/s", None, items=items)
    print_report(lst, audit(items, plan.stages, views, {}), plan.stages)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "  [x] #1 Prepare the data (blocks #2)"
    assert out[3] == "  [~] #2 Train the drafter (blocked by #1, task 7)"
    assert out[5] == "      plan: stage train after prep"

"""The coding agent's todo list in the dashboard (--follow-agent): whole, each claim held against the plan."""

from __future__ import annotations

import pytest

from ops.agents.audit import Claim
from ops.run.views import StageState
from tests.support.agent_lists import local_plan_with_home, write_claude, write_claude_tasks
from tests.support.tmux_sessions import kill_plan_sessions
from tests.support.tui_screens import Seen, aio, until, wait_polled
from tui.app import NodedeckApp
from tui.live import LiveSource
from tui.widgets.plan import PlanList

PLAN = '''
[plan]
name = "{name}"
node = "local"
[[stage]]
id = "train"
title = "Train the drafter"
command = "echo training started; while [ ! -e die ]; do sleep 0.05; done; touch died; exit 3"
verify = [{{ kind = "log_contains", pattern = "training done" }}]
todo = ["train the"]
'''

LONG = "Write the report " + "with every number measured on the node, " * 30


def _claims(status: str) -> list[dict]:
    return [{"content": "Train the EAGLE-3 drafter", "status": status},
            {"content": LONG.strip(), "status": "pending"}]


def _agent_polls(seen: Seen) -> int:
    return sum(1 for view in seen.results(PlanList) if view.agent is not None)


@pytest.fixture
def plan_on_local(tmp_path, monkeypatch):
    name, home, cfg, plan, root = local_plan_with_home(tmp_path, monkeypatch, PLAN, prefix="ag")
    yield home, cfg, plan, root
    kill_plan_sessions(name)


@aio
async def test_a_completed_claim_whose_stage_died_is_contradicted_within_one_refresh(plan_on_local):
    home, cfg, plan, root = plan_on_local
    todo = write_claude(home, "s1", _claims("pending"))
    src = LiveSource(config_path=cfg, plan_path=plan, follow_agent="claude", timeout=5)
    seen = Seen()
    app = NodedeckApp(src, refresh_s=0.2)
    try:
        async with app.run_test(size=(120, 40), message_hook=seen) as pilot:
            await wait_polled(app, pilot, timeout=30)
            panel = app.dash.plan
            await pilot.press("l")
            await until(pilot, lambda: panel.view.agent is not None and panel.view.agent.audits
                        and panel.view.agent.audits[0].claim is Claim.AGREES, 20, "the running stage agreeing")
            # the long item is shown whole, never cut
            rows = [str(w.render()) for w in panel.query(".agent-item")]
            assert len(rows) == 2 and LONG.strip() in rows[1].replace("\n", "")
            assert "coding agent's todo list · claude:s1" in str(panel.query_one(".agent-header").render())

            (root / "die").touch()
            # the dashboard has seen the stage fail (its exit status is on disk, read by a tick) before the claim
            await until(pilot, lambda: panel.view.stages[0].state is StageState.FAILED, 10, "the stage failed")
            assert (root / "died").exists()
            before = _agent_polls(seen)
            write_claude(home, "s1", _claims("completed"))             # the agent ticks it anyway
            await until(pilot, lambda: panel.view.agent.audits[0].claim is Claim.CONTRADICTED, 10, "contradicted")
            assert _agent_polls(seen) - before <= 2                    # the poll in flight, then the next one
            a = panel.view.agent.audits[0]
            assert "stage train is failed" in a.reason
            row = panel.query(".agent-item").first()
            assert row.has_class("-contradicted") and "CONTRADICTED" in str(row.render())
            assert "stage train is failed" in str(row.render())
            notes = lambda: [n for n in app._notifications if n.title == "Agent claim contradicted"]  # noqa: E731
            await until(pilot, notes, 5, "the notification (the app handles it after the panel)")
            assert len(notes()) == 1 and "Train the EAGLE-3 drafter" in notes()[0].message

            # more refreshes: still contradicted, still one notification
            n = _agent_polls(seen)
            await until(pilot, lambda: _agent_polls(seen) >= n + 3, 10, "three more polls")
            assert len([n for n in app._notifications if n.title == "Agent claim contradicted"]) == 1
            assert todo.exists()
    finally:
        src.close()


@aio
async def test_smoke_missing_is_flagged_and_a_bad_list_keeps_the_last_good_one(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    root = tmp_path / "work"
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{root}"\n')
    plan = tmp_path / "p.toml"
    plan.write_text('[plan]\nname = "smokeflag"\nnode = "local"\n[[stage]]\nid = "regen"\ntitle = "Regenerate"\n'
                    'command = "true"\nsmoke_args = "--small"\ntodo = ["regenerate"]\n'
                    'verify = [{ kind = "log_contains", pattern = "x" }]\n')
    todo = write_claude(home, "s2", [{"content": "Regenerate all 10K samples", "status": "in_progress"}])
    src = LiveSource(config_path=cfg, plan_path=plan, follow_agent="claude:s2", timeout=5)
    app = NodedeckApp(src, refresh_s=0.2)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_polled(app, pilot, timeout=30)
            panel = app.dash.plan
            await until(pilot, lambda: panel.view.agent is not None and panel.view.agent.audits, 10, "the list")
            a = panel.view.agent.audits[0]
            assert a.smoke_missing and "SMOKE RUN MISSING" in str(panel.query(".agent-item").first().render())
            todo.write_text('[{"content": "Regenerate all 10K')              # caught half-way
            await until(pilot, lambda: panel.view.agent.error is not None, 10, "the read error")
            assert [x.item.content for x in panel.view.agent.audits] == ["Regenerate all 10K samples"]
            assert "last read failed" in "".join(str(w.render()) for w in panel.query(".todo"))
    finally:
        src.close()


@aio
async def test_a_task_list_shows_the_agents_dependency_graph_beside_the_plans(tmp_path, monkeypatch):
    plan_text = ('[plan]\nname = "{name}"\nnode = "local"\n'
                 '[[stage]]\nid = "prep"\ncommand = "true"\ntodo = ["prepare"]\n'
                 '[[stage]]\nid = "train"\ncommand = "true"\ndepends_on = ["prep"]\ntodo = ["train the"]\n')
    name, home, cfg, plan, root = local_plan_with_home(tmp_path, monkeypatch, plan_text, prefix="agt")
    write_claude_tasks(home / ".claude", "f9d1ad39", [
        {"subject": "Prepare the data", "status": "urgent\x1b[2J", "blocks": ["2"]},
        {"subject": "Train the EAGLE-3 drafter", "status": "pending", "blockedBy": ["1"]}])
    src = LiveSource(config_path=cfg, plan_path=plan, follow_agent="claude", timeout=5)
    app = NodedeckApp(src, refresh_s=0.2)
    try:
        async with app.run_test(size=(140, 40)) as pilot:
            await wait_polled(app, pilot, timeout=30)
            panel = app.dash.plan
            await until(pilot, lambda: panel.view.agent is not None and len(panel.view.agent.audits) == 2, 10,
                        "the task list")
            first, second = [str(w.render()) for w in panel.query(".agent-item")]
            assert "urgent\\x1b[2J" in first and "\x1b" not in first and "blocks #2" in first
            assert "blocked by #1 · plan: stage train after prep" in second
            assert "coding agent's todo list · claude:f9d1ad39" in str(panel.query_one(".agent-header").render())
    finally:
        src.close()
        kill_plan_sessions(name)

"""A stage's whole truth in one typed record (issue 19 item 2): one stage_state row per stage, a typed
verdict, older kv keys taken over once, and the dashboard's reads that need no plan tick first.
Real tmux, SQLite and LocalHost."""

from __future__ import annotations

import json
import sqlite3
import uuid

from ops.run.record import StageRecord, StageVerdict, Why
from ops.run.views import StageState as S
from ops.state.schema import MIGRATIONS
from tests.support.tmux_sessions import kill_plan_sessions
from tests.test_plan_scheduler import env, run_until  # noqa: F401 - env is the fixture

__all__ = ["env"]


def test_the_record_is_one_row_with_a_typed_verdict_and_no_kv_keys(env):
    plan = env.plan('''
[[stage]]
id = "a"
command = "echo ok > a.out"
outputs = ["a.out"]
smoke = { command = "echo smoke > a.out" }
''')
    s = env.scheduler(plan, auto=True)
    res, _ = run_until(s, lambda r: r.done)
    assert res.views[0].state is S.COMPLETED
    rec = s.ctx.record(plan.stage("a"))
    store = s.ctx.handle(plan.stage("a")).store
    runs = store.runs_for_stage(f"{plan.name}/a")
    assert rec.smoke_ok == runs[0].id and rec.launch.run == runs[1].id and not rec.launch.smoke
    assert rec.verdict == StageVerdict(runs[1].id, S.COMPLETED, "exit 0; 1 checks pass", Why.EXIT, rec.verdict.results)
    assert rec.shown.state is S.COMPLETED and len(rec.verdict.results) == 1
    assert store._query("SELECT COUNT(*) FROM kv WHERE key LIKE 'plan/%'")[0][0] == 0
    assert list(store.get_stage_states(plan.name)) == ["a"]
    assert StageRecord.from_json(rec.to_json(), rec.shown) == rec


def test_kv_keys_of_an_older_nodedeck_are_taken_over_once(env):
    plan = env.plan('''
[[stage]]
id = "a"
command = "echo ok > a.out"
outputs = ["a.out"]
''')
    s = env.scheduler(plan, auto=True)
    run_until(s, lambda r: r.done)
    stage = plan.stage("a")
    store = s.ctx.handle(stage).store
    run = store.latest_run(f"{plan.name}/a")
    store.close()
    db = sqlite3.connect(env.db)   # the file as an older nodedeck (schema 2) left it: the record in kv keys
    db.execute("UPDATE schema_version SET version = 2")
    db.execute("UPDATE stage_state SET record = NULL")
    old = {"verdict": {"run": run.id, "state": "completed", "detail": "exit 0; old", "why": "exit", "results": []},
           "launch": {"run": run.id, "attempt": 1, "smoke": False, "log_offset": 0, "node_t0": 1.0}}
    for what, value in old.items():
        db.execute("INSERT INTO kv (key, value, updated_at) VALUES (?, ?, 0)",
                   (f"plan/{plan.name}/a/{what}", json.dumps(value)))
    db.commit()
    db.close()
    again = env.scheduler(plan, auto=True)   # opening the file migrates it
    store = again.ctx.handle(stage).store
    assert store.schema_version == len(MIGRATIONS)
    assert store._query("SELECT COUNT(*) FROM kv WHERE key LIKE 'plan/%'")[0][0] == 0
    res = again.tick()
    assert res.views[0].state is S.COMPLETED and res.views[0].detail == "exit 0; old"
    assert again.ctx.record(stage).verdict.detail == "exit 0; old"
    assert again.ctx.record(stage).launch.node_t0 == 1.0
    assert len(store.runs_for_stage(f"{plan.name}/a")) == 1   # not launched again


def test_the_training_panel_finds_its_metrics_without_a_plan_tick_first(tmp_path):
    from tui.live import LiveSource

    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{tmp_path / "work"}"\nwatch = ["{tmp_path}"]\n')
    name = f"rec{uuid.uuid4().hex[:6]}"
    plan = tmp_path / "plan.toml"
    plan.write_text(f'''[plan]
name = "{name}"
[[stage]]
id = "train"
command = "for i in 1 2 3; do echo '{{\\"step\\": '$i', \\"loss\\": 1.5}}' >> metrics.jsonl; done; sleep 30"
outputs = ["metrics.jsonl"]
''')
    first = LiveSource(config_path=cfg, node="local", plan_path=plan, timeout=5)
    try:
        first.start("train", smoke=False)
        fresh = LiveSource(config_path=cfg, node="local", plan_path=plan, timeout=5)
        try:
            view = fresh.poll_training(100)   # the first poll of a new dashboard: no plan tick yet
            assert fresh.training_path() == str(tmp_path / "work" / "metrics.jsonl"), view.note
            assert "appear once" not in view.note
        finally:
            fresh.close()
    finally:
        first.close()
        kill_plan_sessions(name)

"""StateStore on real SQLite files: schema, runs, events, audit, stage states, sharing."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import threading

import pytest

from ops.errors import UserError
from ops.paths import state_dir
from ops.state import StateStore
from ops.state.schema import MIGRATIONS


@pytest.fixture
def store(tmp_path):
    s = StateStore(tmp_path / "node.sqlite")
    yield s
    s.close()


def test_for_node_creates_file_under_state_dir_in_wal_mode():
    s = StateStore.for_node("gpu-box.1")
    assert s.path == state_dir() / "nodes" / "gpu-box.1.sqlite"
    assert s.path.exists()
    assert s.schema_version == len(MIGRATIONS)
    db = sqlite3.connect(s.path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    s.close()


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", "-x", "a b"])
def test_for_node_rejects_bad_names(bad):
    with pytest.raises(UserError):
        StateStore.for_node(bad)


def test_reopen_keeps_data_and_does_not_remigrate(tmp_path):
    a = StateStore(tmp_path / "s.sqlite")
    a.add_event("note", "hello")
    a.close()
    b = StateStore(tmp_path / "s.sqlite")
    assert [e.message for e in b.events()] == ["hello"]
    assert b.schema_version == len(MIGRATIONS)
    b.close()


def test_newer_schema_is_refused_with_one_line(tmp_path):
    path = tmp_path / "s.sqlite"
    StateStore(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE schema_version SET version = 99")
    db.commit()
    db.close()
    with pytest.raises(UserError, match="newer than this nodedeck"):
        StateStore(path)


def test_garbage_file_is_a_user_error(tmp_path):
    path = tmp_path / "s.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(UserError, match="not a usable nodedeck state file"):
        StateStore(path)


def test_runs_insert_update_latest_and_attempts(store):
    a = store.insert_run(tmux_session="train", command="python -m trainer.train", log_path="/l/a",
                         exit_path="/r/a.exit", run_key="train", smoke=True)
    assert (a.state, a.attempt, a.smoke, a.pid) == ("starting", 1, True, None)
    a = store.update_run(a.id, state="exited", exit_code=0, pid=10, pgid=10, proc_start=12345, ended_at=5.0)
    b = store.insert_run(tmux_session="train", command="python -m trainer.train", log_path="/l/b",
                         exit_path="/r/a.exit", run_key="train")
    assert b.attempt == 2 and b.smoke is False
    assert store.latest_run("train").id == b.id
    assert store.latest_run("train", smoke=True) == a
    assert store.latest_run("train", smoke=False).id == b.id
    assert store.latest_run("other") is None
    assert [r.id for r in store.runs_for_stage("train")] == [a.id, b.id]
    assert [r.id for r in store.active_runs()] == [b.id]
    assert a.proc_start == 12345 and a.exit_code == 0 and not a.active
    c = store.insert_run(tmux_session="adhoc", command="ls", log_path="/l/c", exit_path="/r/c.exit")
    assert c.attempt == 1 and c.stage is None
    assert [r.id for r in store.tmux_session_runs()] == [c.id, b.id]
    assert store.latest_tmux_session_run("train").id == b.id


def test_update_run_rejects_unknown_columns_and_states(store):
    r = store.insert_run(tmux_session="s", command="x", log_path="/l", exit_path="/e")
    with pytest.raises(ValueError):
        store.update_run(r.id, nonsense=1)
    with pytest.raises(ValueError):
        store.update_run(r.id, state="completed")
    with pytest.raises(KeyError):
        store.get_run(9999)


def test_a_run_is_settled_only_from_the_state_its_looker_saw(store):
    """Two processes share a node's state file: a look made before the other settled the run (its stale
    'running' turned 'lost') never overwrites the other's 'exited'."""
    r = store.insert_run(tmux_session="s", command="x", log_path="/l", exit_path="/e")
    running = store.settle_run(r.id, "starting", state="running", pid=7)
    assert running is not None and (running.state, running.pid) == ("running", 7)
    assert store.settle_run(r.id, "running", state="exited", exit_code=0, ended_at=2.0) is not None
    assert store.settle_run(r.id, "running", state="lost", ended_at=3.0) is None
    after = store.get_run(r.id)
    assert (after.state, after.exit_code, after.ended_at) == ("exited", 0, 2.0)
    with pytest.raises(ValueError):
        store.settle_run(r.id, "exited", state="completed")


def test_events_after_id_and_limit(store):
    ids = [store.add_event("k", f"m{i}", run_key="s" if i % 2 else None, data={"i": i}) for i in range(10)]
    evs = store.events()
    assert [e.id for e in evs] == ids
    assert evs[3].data == {"i": 3} and evs[3].stage == "s" and evs[2].stage is None
    assert [e.message for e in store.events(limit=3)] == ["m7", "m8", "m9"]
    assert [e.message for e in store.events(after_id=ids[7])] == ["m8", "m9"]
    assert store.events(after_id=ids[-1]) == []


def test_audit_log(store):
    for i in range(5):
        store.record_audit("gpu1", f"cmd {i}")
    log = store.audit_log(limit=2)
    assert [(a.host, a.command) for a in log] == [("gpu1", "cmd 3"), ("gpu1", "cmd 4")]
    assert log[0].ts <= log[1].ts


def test_audit_log_keeps_the_newest_entries(tmp_path):
    s = StateStore(tmp_path / "a.sqlite", audit_keep=100)
    for i in range(1200):
        s.record_audit("gpu1", f"probe {i}")
    kept = s.audit_log(limit=10_000)
    assert 100 <= len(kept) < 1200
    assert kept[-1].command == "probe 1199" and kept[0].command != "probe 0"
    s.close()


def test_stage_states_per_plan_and_kv(store):
    store.set_stage_state("prep", "running", detail="3/10 datasets")
    store.set_stage_state("prep", "completed", checks=[{"check": "file_exists", "ok": True}])
    store.set_stage_state("prep", "failed", plan="other")
    states = store.get_stage_states()
    assert list(states) == ["prep"]
    assert states["prep"].state == "completed" and states["prep"].detail is None
    assert states["prep"].checks == [{"check": "file_exists", "ok": True}]
    assert store.get_stage_states("other")["prep"].state == "failed"
    store.clear_stage_states()
    assert store.get_stage_states() == {} and "prep" in store.get_stage_states("other")
    assert store.kv_get("missing", 7) == 7
    store.kv_set("cursor", {"offset": 12})
    store.kv_set("cursor", {"offset": 13})
    assert store.kv_get("cursor") == {"offset": 13}
    store.kv_delete("cursor")
    assert store.kv_get("cursor") is None


def test_two_stores_on_one_file_see_each_others_writes(tmp_path):
    tui, cli = StateStore(tmp_path / "n.sqlite"), StateStore(tmp_path / "n.sqlite")
    r = cli.insert_run(tmux_session="gen", command="x", log_path="/l", exit_path="/e", run_key="gen")
    assert tui.latest_run("gen").id == r.id
    tui.update_run(r.id, state="running", pid=42)
    assert cli.get_run(r.id).pid == 42
    eid = tui.add_event("run.running", "gen running")
    assert [e.id for e in cli.events(after_id=eid - 1)] == [eid]
    tui.close()
    cli.close()


def _write_events(path, n, tag):
    s = StateStore(path)
    for i in range(n):
        s.add_event("proc", f"{tag}-{i}")
        s.insert_run(tmux_session=tag, command="x", log_path="/l", exit_path="/e", run_key=tag)
    s.close()


def test_two_processes_write_concurrently(tmp_path):
    path = tmp_path / "n.sqlite"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_events, args=(path, 100, t)) for t in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    s = StateStore(path)
    msgs = [e.message for e in s.events(limit=1000)]
    assert sorted(msgs) == sorted([f"{t}-{i}" for t in "ab" for i in range(100)])
    assert [r.attempt for r in s.runs_for_stage("a")] == list(range(1, 101))
    s.close()


def test_threads_share_one_store(store):
    errors = []

    def work(tag):
        try:
            for i in range(50):
                store.add_event("t", f"{tag}{i}")
                store.events(limit=5)
        except Exception as e:  # collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in "xyz"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store.events(limit=1000)) == 150


def test_stage_keys_of_an_older_nodedeck_move_into_the_records(tmp_path):
    path = tmp_path / "s.sqlite"
    StateStore(path).close()
    db = sqlite3.connect(path)   # as schema 2 left it: records null, the stage's truth in kv keys
    db.execute("UPDATE schema_version SET version = 2")
    db.execute("INSERT INTO stage_state (plan, stage, state, detail, updated_at, checks) VALUES"
               " ('demo', 'prep', 'completed', 'exit 0', 1.0, '{\"results\": [], \"smoke\": false, \"attempt\": 1}')")
    db.execute("INSERT INTO stage_state (plan, stage, state, detail, updated_at, checks, record) VALUES"
               " ('demo', 'kept', 'failed', 'exit 1', 1.0, NULL, '{\"up\": 4}')")
    kv = {"plan/demo/prep/launch": {"run": 3, "attempt": 1, "smoke": False},
          "plan/demo/prep/skip": {"run": 3}, "plan/demo/prep/smoke_ok": 2,
          "plan/demo/train/up": 5, "plan/demo/kept/up": 9, "plans/demo": {"path": "/p.toml"}}
    for key, value in kv.items():
        db.execute("INSERT INTO kv (key, value, updated_at) VALUES (?, ?, 0)", (key, json.dumps(value)))
    db.commit()
    db.close()
    s = StateStore(path)
    assert s.schema_version == len(MIGRATIONS)
    assert s.kv_keys("plan") == ["plans/demo"]
    rows = s.get_stage_states("demo")
    assert (rows["prep"].state, rows["prep"].detail) == ("completed", "exit 0")
    assert rows["prep"].record == {"launch": {"run": 3, "attempt": 1, "smoke": False}, "verdict": None,
                                   "smoke_ok": 2, "skip": {"run": 3}, "up": None}
    assert (rows["train"].state, rows["train"].detail) == ("pending", "not looked at yet")
    assert rows["train"].record == {"launch": None, "verdict": None, "smoke_ok": None, "skip": None, "up": 5}
    assert rows["kept"].record == {"up": 4, "skip": None}   # a record already written is the truth
    s.close()


@pytest.mark.parametrize("skipped, skip", [(False, None), (None, {"run": None}), (7, {"run": 7})])
def test_a_skip_is_stored_as_a_record_of_its_own(tmp_path, skipped, skip):
    path = tmp_path / "s.sqlite"
    StateStore(path).close()
    db = sqlite3.connect(path)   # as schema 3 left it: `skipped` false, null or a run id
    db.execute("UPDATE schema_version SET version = 3")
    db.execute("INSERT INTO stage_state (plan, stage, state, updated_at, record)"
               " VALUES ('demo', 'a', 'skipped', 1.0, ?)",
               (json.dumps({"launch": None, "smoke_ok": 2, "skipped": skipped}),))
    db.commit()
    db.close()
    s = StateStore(path)
    assert s.get_stage_state("demo", "a").record == {"launch": None, "smoke_ok": 2, "skip": skip}
    s.close()

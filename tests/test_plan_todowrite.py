"""todowrite JSON: export of a plan's state, import as manual todos, following a file being rewritten."""

from __future__ import annotations

import json
import os

import pytest

from cli.main import main
from ops.plan.records import Priority, StageKind
from ops.run.todowrite import ManualTodos, TodoError, TodoFollower, export_todos, parse_todos
from ops.run.views import StageState, StageView
from ops.state import StateStore


def view(sid, state, detail="", title=None, priority=Priority.MEDIUM):
    return StageView(sid, title or f"Do {sid}", priority, (), StageKind.JOB, "local", state, detail)


def test_export_maps_every_state():
    views = [view(s.value, s, "why") for s in StageState]
    doc = export_todos(views)
    got = {t["id"]: (t["status"], t["content"]) for t in doc["todos"]}
    assert got == {
        "pending": ("pending", "Do pending"), "ready": ("pending", "Do ready"),
        "running": ("in_progress", "Do running"), "verifying": ("in_progress", "Do verifying"),
        "completed": ("completed", "Do completed"), "failed": ("pending", "Do failed [failed: why]"),
        "blocked": ("pending", "Do blocked [blocked: why]"), "skipped": ("cancelled", "Do skipped"),
    }
    # what we export is valid todowrite input
    assert [t.id for t in parse_todos(json.dumps(doc), "x.json")] == [s.value for s in StageState]


@pytest.mark.parametrize("doc,fragment", [
    ('{"todos": [{"content": "a", "status": "done"}]}', "todos[0]: status must be one of"),
    ('{"todos": [{"content": "a"}, {"content": ""}]}', "todos[1]: content must be a non-empty string"),
    ('{"todos": [{"content": "a", "priority": "urgent"}]}', "todos[0]: priority must be high, medium or low"),
    ('{"todos": [{"id": 1, "content": "a"}, {"id": "1", "content": "b"}]}', "todos[1]: duplicate id '1'"),
    ('{"todos": [3]}', "todos[0]: must be an object"),
    ('{"todo": []}', "expected {\"todos\": [...]}"),
    ('{"todos": [\n{"content": "a",\n', "plan.json:3: invalid JSON"),
])
def test_import_validation_names_file_and_index(doc, fragment):
    with pytest.raises(TodoError) as ei:
        parse_todos(doc, "plan.json")
    assert fragment in str(ei.value) and str(ei.value).startswith("plan.json") and "\n" not in str(ei.value)


def test_export_import_round_trip_through_the_cli(tmp_path, capsys):
    plan = tmp_path / "p.toml"
    plan.write_text('[plan]\nname = "rt"\n[[stage]]\nid = "a"\ntitle = "Prepare data"\npriority = "high"\n'
                    'command = "true"\n[[stage]]\nid = "b"\ntitle = "Train"\ndepends_on = ["a"]\ncommand = "true"\n')
    out = tmp_path / "todos.json"
    assert main(["todo", "export", "--plan", str(plan), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc == {"todos": [
        {"id": "a", "content": "Prepare data", "status": "pending", "priority": "high"},
        {"id": "b", "content": "Train", "status": "pending", "priority": "medium"},
    ]}
    assert main(["todo", "import", str(out)]) == 0
    assert "2 new, 0 updated" in capsys.readouterr().out
    assert main(["todo", "done", "b"]) == 0
    assert main(["todo", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert [(t["id"], t["status"]) for t in listed["todos"]] == [("a", "pending"), ("b", "completed")]
    # importing again updates by id and loses nothing else
    out.write_text(json.dumps({"todos": [{"id": "a", "content": "Prepare data", "status": "in_progress"},
                                         {"id": "c", "content": "Extra", "status": "pending"}]}))
    assert main(["todo", "import", str(out)]) == 0
    items = ManualTodos(StateStore.for_node("local")).items()
    assert [(i.id, i.status) for i in items] == [("a", "in_progress"), ("b", "completed"), ("c", "pending")]
    assert main(["todo", "done", "zz"]) == 2
    assert "no manual todo 'zz'" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"todos": [{"content": "x", "status": "later"}]}')
    assert main(["todo", "import", str(bad)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"nodedeck: {bad}:1: todos[0]: status must be one of pending, in_progress, completed, cancelled, got 'later'")
    assert len(ManualTodos(StateStore.for_node("local")).items()) == 3


def test_follow_rereads_on_change_and_survives_partial_writes(tmp_path):
    f = tmp_path / "assistant.json"
    follower = TodoFollower(f)
    st = follower.poll()
    assert st.items == [] and "no such file" in st.error
    f.write_text(json.dumps({"todos": [{"id": "1", "content": "Read the logs", "status": "in_progress"}]}))
    st = follower.poll()
    assert st.changed and [i.content for i in st.items] == ["Read the logs"] and st.error is None
    assert not follower.poll().changed
    # a write caught half-way: the last good list stays, with the error; the next poll retries
    f.write_text('{"todos": [{"id": "1", "content": "Read the logs", "status": "completed"}, {"id": "2", "con')
    st = follower.poll()
    assert st.error and "invalid JSON" in st.error and [i.status for i in st.items] == ["in_progress"]
    f.write_text(json.dumps({"todos": [{"id": "1", "content": "Read the logs", "status": "completed"},
                                       {"id": "2", "content": "Fix the regen", "status": "pending"}]}))
    stat = f.stat()
    os.utime(f, ns=(stat.st_atime_ns, stat.st_mtime_ns))   # same mtime is fine: the retry still reads it
    st = follower.poll()
    assert st.changed and st.error is None and [i.status for i in st.items] == ["completed", "pending"]


def test_follow_once_cli(tmp_path, capsys):
    f = tmp_path / "a.json"
    f.write_text(json.dumps([{"content": "Check disk before hidden states", "status": "pending", "priority": "high"}]))
    assert main(["todo", "follow", str(f), "--once"]) == 0
    out = capsys.readouterr().out
    assert "1 todos" in out and "[ ] 1  high    Check disk before hidden states" in out
    assert main(["todo", "follow", str(f), "--once", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["todos"][0]["priority"] == "high"
    f.write_text("{")
    assert main(["todo", "follow", str(f), "--once"]) == 2

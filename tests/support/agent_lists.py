"""Coding agents' todo lists written the way the agents write them (from their public sources)."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path


def opencode_data(home: Path) -> Path:
    """$XDG_DATA_HOME/opencode as the tests set it (XDG_DATA_HOME = home/.local/share)."""
    return home / ".local" / "share" / "opencode"


def write_opencode_json(home: Path, session: str, items: list[dict], *, directory: str | None = None,
                        project: str = "proj1") -> Path:
    """Older opencode: storage/todo/<session>.json (items with id) and storage/session/<project>/<session>.json."""
    data = opencode_data(home)
    todo = data / "storage" / "todo" / f"{session}.json"
    todo.parent.mkdir(parents=True, exist_ok=True)
    todo.write_text(json.dumps([{"id": str(n + 1), "priority": "medium", **i} for n, i in enumerate(items)], indent=2))
    if directory:
        info = data / "storage" / "session" / project / f"{session}.json"
        info.parent.mkdir(parents=True, exist_ok=True)
        now = int(time.time() * 1000)
        info.write_text(json.dumps({"id": session, "projectID": project, "directory": directory, "title": "t",
                                    "version": "0.9.0", "time": {"created": now, "updated": now}}))
    return todo


OPENCODE_SCHEMA = """
CREATE TABLE session (id TEXT PRIMARY KEY, project_id TEXT NOT NULL, parent_id TEXT, slug TEXT NOT NULL,
  directory TEXT NOT NULL, title TEXT NOT NULL, version TEXT NOT NULL, time_created INTEGER NOT NULL,
  time_updated INTEGER NOT NULL);
CREATE TABLE todo (session_id TEXT NOT NULL REFERENCES session(id) ON DELETE CASCADE, content TEXT NOT NULL,
  status TEXT NOT NULL, priority TEXT NOT NULL, position INTEGER NOT NULL, time_created INTEGER NOT NULL,
  time_updated INTEGER NOT NULL, PRIMARY KEY (session_id, position));
CREATE INDEX todo_session_idx ON todo (session_id);
"""


def opencode_db(home: Path) -> Path:
    """Newer opencode: one SQLite database in WAL mode, created on first use."""
    path = opencode_data(home) / "opencode.db"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(path)
        con.execute("PRAGMA journal_mode = WAL")
        con.executescript(OPENCODE_SCHEMA)
        con.close()
    return path


def write_opencode_db(home: Path, session: str, items: list[dict], *, directory: str = "/work/proj",
                      when_ms: int | None = None) -> Path:
    """Replace a session's todos the way opencode does: delete the session's rows, insert by position."""
    path = opencode_db(home)
    now = when_ms or int(time.time() * 1000)
    con = sqlite3.connect(path)
    with con:
        con.execute("INSERT OR REPLACE INTO session VALUES (?, 'p', NULL, ?, ?, 't', '1.0.0', ?, ?)",
                    (session, session, directory, now, now))
        con.execute("DELETE FROM todo WHERE session_id = ?", (session,))
        con.executemany("INSERT INTO todo VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [(session, i["content"], i["status"], i.get("priority", "medium"), n, now, now)
                         for n, i in enumerate(items)])
    con.close()
    return path


def write_claude(home: Path, session: str, items: list[dict], *, cwd: str | None = None) -> Path:
    """Claude Code: ~/.claude/todos/<session>-agent-<session>.json, and a transcript naming its cwd."""
    todo = home / ".claude" / "todos" / f"{session}-agent-{session}.json"
    todo.parent.mkdir(parents=True, exist_ok=True)
    todo.write_text(json.dumps([{"activeForm": f"Doing: {i['content']}", **i} for i in items]))
    if cwd:
        tr = home / ".claude" / "projects" / cwd.replace("/", "-") / f"{session}.jsonl"
        tr.parent.mkdir(parents=True, exist_ok=True)
        tr.write_text(json.dumps({"type": "summary"}) + "\n" + json.dumps({"cwd": cwd, "sessionId": session}) + "\n")
    return todo


CLAUDE_VERSION = "2.1.332"


def claude_project_dir(config: Path, cwd: str) -> Path:
    """Where Claude Code 2.1 keeps a project's transcripts: every non-alphanumeric character of the cwd as '-'."""
    return config / "projects" / "".join(c if c.isascii() and c.isalnum() else "-" for c in cwd)


def write_claude_tasks(config: Path, list_id: str, tasks: list[dict]) -> Path:
    """Claude Code 2.1's Task tools: `<config>/tasks/<list id>/<id>.json` per task (indent 2, its keys in the
    client's order), an empty `.lock` beside them. A task given without an id gets its 1-based place."""
    d = config / "tasks" / list_id
    d.mkdir(parents=True, exist_ok=True)
    (d / ".lock").touch()
    for n, t in enumerate(tasks, 1):
        doc = {"id": t.get("id", str(n)), "subject": t["subject"], "description": t.get("description", "")}
        if "activeForm" in t:
            doc["activeForm"] = t["activeForm"]
        doc.update(status=t.get("status", "pending"), blocks=t.get("blocks", []), blockedBy=t.get("blockedBy", []))
        (d / f"{doc['id']}.json").write_text(json.dumps(doc, indent=2))
    return d


def _record(session: str, cwd: str, **fields) -> str:
    return json.dumps({"parentUuid": None, "isSidechain": False, **fields, "userType": "external",
                       "entrypoint": "sdk-cli", "cwd": cwd, "sessionId": session, "version": CLAUDE_VERSION})


def write_claude_transcript(config: Path, session: str, cwd: str, todo_writes: list[list[dict]] = (),
                            *, failed_last: bool = False) -> Path:
    """A Claude Code 2.1 transcript `<config>/projects/<cwd as dashes>/<session>.jsonl`: the queue records, the
    prompt, then each TodoWrite as the client records it (the model's tool_use, then the tool_result with
    `toolUseResult.oldTodos/newTodos`). `failed_last`: the last TodoWrite was refused (an error result)."""
    path = claude_project_dir(config, cwd) / f"{session}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"type": "queue-operation", "operation": "enqueue", "sessionId": session, "content": "go"}),
             json.dumps({"type": "queue-operation", "operation": "dequeue", "sessionId": session}),
             _record(session, cwd, type="user", message={"role": "user", "content": "go"},
                     timestamp="2026-12-06T15:25:52.851Z"),
             _record(session, cwd, type="attachment", attachment={"type": "prompt_snapshot",
                                                                   "systemPrompt": ["You are an agent " * 4000]})]
    old: list[dict] = []
    for n, todos in enumerate(todo_writes):
        use = f"toolu_{n}"
        stamp = f"2026-12-06T15:26:{n:02d}.500Z"
        lines.append(_record(session, cwd, type="assistant", timestamp=stamp, message={
            "id": f"msg_{n}", "type": "message", "role": "assistant", "model": "claude-opus-5-5",
            "content": [{"type": "tool_use", "id": use, "name": "TodoWrite", "input": {"todos": todos}}]}))
        if failed_last and n == len(todo_writes) - 1:
            lines.append(_record(session, cwd, type="user", timestamp=stamp, message={"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use, "is_error": True,
                 "content": "<tool_use_error>InputValidationError</tool_use_error>"}]},
                toolUseResult="Error: InputValidationError"))
            continue
        lines.append(_record(session, cwd, type="user", timestamp=stamp, message={"role": "user", "content": [
            {"tool_use_id": use, "type": "tool_result", "content": "Todos have been modified successfully."}]},
            toolUseResult={"oldTodos": old, "newTodos": todos}))
        old = todos
    lines.append(json.dumps({"type": "last-prompt", "lastPrompt": "go", "sessionId": session}))
    path.write_text("\n".join(lines) + "\n")
    return path


def touch_later(path: Path, seconds: float) -> None:
    st = path.stat()
    os.utime(path, (st.st_atime + seconds, st.st_mtime + seconds))


def local_plan_with_home(tmp_path: Path, monkeypatch, template: str, *, prefix: str, node_extra: str = ""):
    """A fake HOME for the agents' lists, a nodes.toml rooted in tmp_path/work, and the plan `template`
    (formatted with its unique name) written to tmp_path/p.toml: (name, home, cfg, plan, root)."""
    import uuid

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    root = tmp_path / "work"
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{root}"\n{node_extra}')
    plan = tmp_path / "p.toml"
    plan.write_text(template.format(name=name))
    return name, home, cfg, plan, root

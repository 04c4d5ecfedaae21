"""Write the node's truth back in an agent's own todo format (`nodedeck todo export --format ...`).

- todowrite: `{"todos": [{id, content, status, priority}]}` (ops.run.todowrite)
- opencode:  `[{content, status, priority}]` (its current items have no id)
- claude:    `[{content, status, activeForm}]`, status only pending / in_progress / completed:
             a skipped stage is written completed with "(skipped)" in its text
"""

from __future__ import annotations

from typing import Iterable

from ops.run.todowrite import export_todos, stage_todo
from ops.run.views import StageView, TodoItem

FORMATS = ("todowrite", "opencode", "claude")


def _claude(todo: dict) -> dict:
    status, content = todo["status"], todo["content"]
    if status == "cancelled":
        status, content = "completed", f"{content} (skipped)"
    return {"content": content, "status": status, "activeForm": f"Working on: {todo['content']}"}


def export_as(fmt: str, views: Iterable[StageView], manual: Iterable[TodoItem] = ()):
    """The document in `fmt` (one of FORMATS) for the plan's stages, then any manual items."""
    if fmt == "todowrite":
        return export_todos(views, manual)
    todos = [stage_todo(v) for v in views] + [m.to_json() for m in manual]
    if fmt == "opencode":
        return [{"content": t["content"], "status": t["status"], "priority": t["priority"]} for t in todos]
    if fmt == "claude":
        return [_claude(t) for t in todos]
    raise ValueError(f"unknown todo format {fmt!r}")

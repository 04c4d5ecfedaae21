"""todowrite JSON interop: export a plan's state, import manual todos, follow an assistant's list.

The format is `{"todos": [{"id", "content", "status", "priority"}]}` with status
pending | in_progress | completed | cancelled and priority high | medium | low
(a bare list of items is read too). Stage states map to it like this:

    pending, ready           -> pending
    running, verifying       -> in_progress
    completed                -> completed
    failed, blocked          -> pending, the content saying "[failed: why]" / "[blocked: why]"
                                (the work is still to be done: it is not cancelled)
    skipped                  -> cancelled

Imported items are manual todos kept in the node's StateStore (kv `todos/manual`),
shown beside the stages and ticked with `nodedeck todo done ID`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ops.errors import UserError
from ops.inputfile import MAX_DEPTH, deep_line, read_input, too_deep, utf8_text
from ops.plan.records import Priority
from ops.run.views import StageState, StageView, TodoItem

STATUSES = ("pending", "in_progress", "completed", "cancelled")
KV_MANUAL = "todos/manual"
MAX_ITEMS = 10_000
MAX_CONTENT = 10_000
MAX_ID = 200

_STATE_TO_STATUS = {
    StageState.PENDING: "pending",
    StageState.READY: "pending",
    StageState.RUNNING: "in_progress",
    StageState.VERIFYING: "in_progress",
    StageState.COMPLETED: "completed",
    StageState.FAILED: "pending",
    StageState.BLOCKED: "pending",
    StageState.SKIPPED: "cancelled",
}


class TodoError(UserError):
    """A todowrite file that cannot be used: one line naming the file and the item."""


def stage_todo(view: StageView) -> dict:
    content = view.title
    if view.state in (StageState.FAILED, StageState.BLOCKED):
        content = f"{content} [{view.state.value}: {view.detail}]"
    return {"id": view.id, "content": content, "status": _STATE_TO_STATUS[view.state], "priority": view.priority.value}


def export_todos(views: Iterable[StageView], manual: Iterable[TodoItem] = ()) -> dict:
    """The todowrite document of a plan's stages (then any manual items)."""
    todos = [stage_todo(v) for v in views]
    todos += [m.to_json() for m in manual]
    return {"todos": todos}


def parse_todos(text: str | bytes, source: str, *, number_missing_ids: bool = True) -> list[TodoItem]:
    """Validate a todowrite document; raise TodoError `source:line: todos[i]: message`.

    Also reads opencode's and Claude Code's arrays (no ids; Claude's `activeForm` is ignored). Items
    without an id get their position as id, or "" with number_missing_ids=False (import matches
    those by content)."""
    if isinstance(text, bytes):
        text = utf8_text(text, source, TodoError)
    try:
        data = json.loads(text)
    except RecursionError:
        data = None
    except ValueError as e:
        line = getattr(e, "lineno", None) or 1
        msg = getattr(e, "msg", str(e)).replace("\n", " ")
        raise TodoError(f"{source}:{line}: invalid JSON: {msg}") from None
    if data is None and text.strip() != "null" or too_deep(data):
        raise TodoError(f"{source}:{deep_line(text)}: arrays or objects nested deeper than {MAX_DEPTH} levels")
    items = data.get("todos") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise TodoError(f"{source}:1: expected {{\"todos\": [...]}} or a list of todo items")
    if len(items) > MAX_ITEMS:
        raise TodoError(f"{source}:1: more than {MAX_ITEMS} todo items")
    lines = _item_lines(text, isinstance(data, dict))
    out: list[TodoItem] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        where = f"{source}:{lines[i] if i < len(lines) else 1}: todos[{i}]"
        if not isinstance(item, dict):
            raise TodoError(f"{where}: must be an object with content and status")
        content = item.get("content")
        if not isinstance(content, str) or not content.strip():
            raise TodoError(f"{where}: content must be a non-empty string")
        if len(content) > MAX_CONTENT or not _printable(content, "\n\t"):
            raise TodoError(f"{where}: content must be text of at most {MAX_CONTENT} characters "
                            "(no control characters or lone surrogates)")
        status = item.get("status", "pending")
        if status not in STATUSES:
            raise TodoError(f"{where}: status must be one of {', '.join(STATUSES)}, got {_short(status)}")
        priority = item.get("priority", "medium")
        if priority not in ("high", "medium", "low"):
            raise TodoError(f"{where}: priority must be high, medium or low, got {_short(priority)}")
        tid = item.get("id", str(i + 1) if number_missing_ids else None)
        if tid is None:
            out.append(TodoItem("", content, status, Priority(priority), source))
            continue
        if isinstance(tid, bool) or not isinstance(tid, (str, int)) or not str(tid).strip() \
                or len(str(tid)) > MAX_ID or not _printable(str(tid), ""):
            raise TodoError(f"{where}: id must be a non-empty string (at most {MAX_ID} printable characters) "
                            "or integer")
        tid = str(tid)
        if tid in seen:
            raise TodoError(f"{where}: duplicate id {tid!r}")
        seen.add(tid)
        out.append(TodoItem(tid, content, status, Priority(priority), source))
    return out


def _printable(s: str, allowed: str) -> bool:
    """No control characters (but those in allowed) and no lone surrogates (they cannot be printed)."""
    return not any((c < " " and c not in allowed) or c == "\x7f" or "\ud800" <= c <= "\udfff" for c in s)


def _item_lines(text: str, in_object: bool) -> list[int]:
    """The line of each item of the todo array (top-level, or under "todos"), read with raw_decode."""
    dec = json.JSONDecoder()
    ws = " \t\n\r"

    def skip(pos: int) -> int:
        while pos < len(text) and text[pos] in ws:
            pos += 1
        return pos

    try:
        pos = skip(0)
        if in_object:
            pos = skip(pos + 1)
            while text[pos] != "}":
                key, pos = dec.raw_decode(text, pos)
                pos = skip(skip(pos) + 1)       # past ':'
                if key == "todos":
                    break
                _, pos = dec.raw_decode(text, pos)
                pos = skip(pos)
                pos = skip(pos + 1) if text[pos] == "," else pos
        starts = []
        pos = skip(pos + 1)                     # past '['
        while text[pos] != "]":
            starts.append(pos)
            _, pos = dec.raw_decode(text, pos)
            pos = skip(pos)
            pos = skip(pos + 1) if text[pos] == "," else pos
    except (ValueError, IndexError, RecursionError):
        return []
    return [text.count("\n", 0, p) + 1 for p in starts]


def _short(v: Any) -> str:
    s = repr(v).replace("\n", "\\n")
    return s if len(s) <= 40 else s[:37] + "..."


def load_todos(path: str | Path, *, number_missing_ids: bool = True) -> list[TodoItem]:
    p = Path(path)
    try:
        raw = read_input(p, "todo list")
    except UserError as e:
        raise TodoError(str(e)) from None
    return parse_todos(raw, str(p), number_missing_ids=number_missing_ids)


def _free_id(taken) -> str:
    n = len(taken) + 1
    while str(n) in taken:
        n += 1
    return str(n)


class ManualTodos:
    """Manual todo items of a node, in its StateStore."""

    def __init__(self, store):
        self.store = store

    def items(self) -> list[TodoItem]:
        raw = self.store.kv_get(KV_MANUAL, [])
        return [TodoItem(d["id"], d["content"], d["status"], Priority(d["priority"]), d.get("source", ""))
                for d in raw]

    def _save(self, items: list[TodoItem]) -> None:
        self.store.kv_set(KV_MANUAL, [{**i.to_json(), "source": i.source} for i in items])

    def import_items(self, new: list[TodoItem], *, replace: bool = False) -> tuple[int, int]:
        """Add items (same id, or for an item without id the same text: updated); returns (added, updated)."""
        items = [] if replace else self.items()
        index = {i.id: n for n, i in enumerate(items)}
        by_text = {" ".join(i.content.lower().split()): i.id for i in items}
        taken = set(index) | {i.id for i in new if i.id}     # ids named in the list are never handed out
        added = updated = 0
        for item in new:
            if not item.id:
                key = " ".join(item.content.lower().split())
                tid = by_text.get(key) or _free_id(taken)
                taken.add(tid)
                item = TodoItem(tid, item.content, item.status, item.priority, item.source)
                by_text[key] = tid
            if item.id in index:
                items[index[item.id]] = item
                updated += 1
            else:
                index[item.id] = len(items)
                items.append(item)
                added += 1
        self._save(items)
        return added, updated

    def set_status(self, todo_id: str, status: str) -> TodoItem:
        if status not in STATUSES:
            raise UserError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        items = self.items()
        for n, item in enumerate(items):
            if item.id == todo_id:
                items[n] = TodoItem(item.id, item.content, status, item.priority, item.source)
                self._save(items)
                return items[n]
        known = ", ".join(i.id for i in items) or "none"
        raise UserError(f"no manual todo {todo_id!r} (ids: {known})")

    def remove(self, todo_id: str) -> None:
        items = self.items()
        kept = [i for i in items if i.id != todo_id]
        if len(kept) == len(items):
            raise UserError(f"no manual todo {todo_id!r}")
        self._save(kept)


@dataclass
class FollowState:
    items: list[TodoItem]
    error: str | None      # the last read failed (a partial write, bad JSON): items are the last good ones
    changed: bool
    read_at: float


class TodoFollower:
    """Follows a todowrite file another program (an AI assistant) rewrites.

    `poll()` re-reads it when its mtime or size changed; a read that does not
    parse (a write caught half-way) keeps the last good list and is retried on
    the next poll even when the file looks unchanged.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._sig: tuple[int, int] | None = None
        self.items: list[TodoItem] = []
        self.error: str | None = None
        self._retry = False

    def poll(self) -> FollowState:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            changed = self.error is None or bool(self.items)
            self.error = f"{self.path}: no such file (waiting for it)"
            self._sig = None
            return FollowState(self.items, self.error, changed, time.time())
        sig = (st.st_mtime_ns, st.st_size)
        if sig == self._sig and not self._retry:
            return FollowState(self.items, self.error, False, time.time())
        self._sig = sig
        try:
            items = load_todos(self.path)
        except TodoError as e:
            self._retry = True
            changed = self.error != str(e)
            self.error = str(e)
            return FollowState(self.items, self.error, changed, time.time())
        self._retry = False
        changed = items != self.items or self.error is not None
        self.items, self.error = items, None
        return FollowState(items, None, changed, time.time())

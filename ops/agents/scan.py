"""Find and read coding agents' todo lists on one machine; standard library only.

This module also runs on a node, sent over SSH as `python3 -c` with the home directory
to scan (see ops.agents.discover), so it imports nothing but the standard library and
answers in plain JSON-ready dicts. The formats, as the clients write them (README, "Coding agents"):

- opencode 1.18: the SQLite database `$XDG_DATA_HOME/opencode/opencode*.db` (WAL mode), table
  `todo(session_id, content, status, priority, position, time_created, time_updated)` and table
  `session(id, directory, title, time_updated, ...)`. Its items have no id.
- opencode, older versions: `$XDG_DATA_HOME/opencode/storage/todo/<sessionID>.json`, a JSON
  array of `{id, content, status, priority}`; the session's directory in
  `storage/session/<projectID>/<sessionID>.json` (`directory`, `title`).
- Claude Code 2.1 (`~/.claude`, or `$CLAUDE_CONFIG_DIR`), Task tools: `tasks/<list id>/<id>.json`, one
  task a file `{id, subject, description, activeForm, status, blocks, blockedBy}`; the list id is the
  session's (or `CLAUDE_CODE_TASK_LIST_ID`, or a team's). Its TodoWrite tool keeps the list in memory:
  on disk it is the last TodoWrite of the session's transcript `projects/<cwd as dashes>/<session>.jsonl`
  (`toolUseResult.newTodos`, or the tool_use's input while its result is not written yet). A session's
  directory is the `cwd` of its transcript.
- Claude Code, older versions: `todos/<session>-agent-<agent>.json`, a JSON array of
  `{content, status, activeForm}`.
- todowrite files named on the command line: `{"todos": [...]}` or a bare array.

Statuses and priorities are the agents' own words, kept verbatim (opencode stores any string a
model sends): only `completed` claims completion (ops.agents.audit). Every list is a dict
`{agent, session, project, path, updated, items, error}`; a list that cannot be read has `error`
(one line naming the file and the field) and no items. Everything read is bounded: a file by
MAX_BYTES, lists by MAX_LISTS, transcripts by TRANSCRIPT_BYTES each and TRANSCRIPT_BUDGET in all.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import re
import sqlite3
import stat
import sys
import threading
import time
import urllib.parse

AGENTS = ("opencode", "claude", "todowrite")
MAX_BYTES = 16 * 1024 * 1024      # a todo list larger than this is refused, not read
MAX_LISTS = 2000                  # per agent, newest first
MAX_TASKS = 5000                  # task files in one Claude Code task list
TRANSCRIPT_BYTES = 16 * 1024 * 1024   # of a transcript's end searched for its last TodoWrite
TRANSCRIPT_BUDGET = 64 * 1024 * 1024   # transcripts' bytes read by one scan, newest transcripts first
REREAD_TRIES = 5                  # a task file caught half-written is read again this often ...
REREAD_S = 0.05                   # ... this long apart, and one scan waits for such files at most
REREAD_WAITS = 20                 # this many times (a list of broken files does not hold a scan for long)


class FormatError(Exception):
    """The file is not in the format its agent writes: the message names the field."""


class Unfinished(FormatError):
    """Not (yet) whole JSON: a file read while its writer was still writing it looks like this."""


def _read_regular(path: str) -> bytes:
    """The bytes of a regular file (never a FIFO or device: those would block), at most MAX_BYTES."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FormatError("not a regular file")
        if st.st_size > MAX_BYTES:
            raise FormatError(f"larger than {MAX_BYTES // (1024 * 1024)} MiB")
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _loads(raw: bytes):
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise Unfinished(f"not UTF-8 text (byte {e.start})") from None
    except ValueError as e:
        raise Unfinished(f"invalid JSON (line {getattr(e, 'lineno', '?')}): {getattr(e, 'msg', e)}") from None
    except RecursionError:
        raise FormatError("invalid JSON: arrays or objects nested too deeply") from None


def _json(path: str):
    return _loads(_read_regular(path))


def _field(at: str, key: str) -> str:
    return f"{at}.{key}" if at else key


def _text(item: dict, key: str, at: str, *, required: bool = False) -> str | None:
    """A string field; required: non-empty, one line of printable text (an item's title)."""
    v = item.get(key)
    if v is None and not required:
        return None
    if not isinstance(v, str) or (required and not v.strip()):
        raise FormatError(f"{_field(at, key)}: expected a {'non-empty ' if required else ''}string")
    if required and any((c < " " and c not in "\n\t") or "\ud800" <= c <= "\udfff" for c in v):
        raise FormatError(f"{_field(at, key)}: control characters or lone surrogates in the text")
    return v


def _ids(item: dict, key: str, at: str) -> list[str]:
    v = item.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or len(v) > MAX_TASKS or not all(isinstance(x, str) for x in v):
        raise FormatError(f"{_field(at, key)}: expected an array of task ids")
    return v


def _item(item, at: str, title: str = "content") -> dict:
    """One item checked and normalised. Its status and priority are the agent's own words, kept as written."""
    if not isinstance(item, dict):
        raise FormatError(f"{at or 'top level'}: expected an object, got {type(item).__name__}")
    content = _text(item, title, at, required=True)
    status = item.get("status")
    if not isinstance(status, str) or not status.strip():
        raise FormatError(f"{_field(at, 'status')}: expected a word, got {str(status)[:40]!r}")
    tid = item.get("id")
    if tid is not None and (isinstance(tid, bool) or not isinstance(tid, (str, int))):
        raise FormatError(f"{_field(at, 'id')}: expected a string or integer")
    return {"id": None if tid is None else str(tid), "content": content, "status": status,
            "priority": _text(item, "priority", at), "active_form": _text(item, "activeForm", at),
            "description": _text(item, "description", at),
            "blocks": _ids(item, "blocks", at), "blocked_by": _ids(item, "blockedBy", at)}


def _items(data, agent: str, *, where: str = "") -> list[dict]:
    """Check and normalise one agent's array of items."""
    if not isinstance(data, list):
        raise FormatError(f"{where or 'top level'}: expected an array of todo items, got {type(data).__name__}")
    return [_item(item, f"{where}[{n}]") for n, item in enumerate(data)]


def _entry(agent, agent_session, project, path, updated, items=None, error=None) -> dict:
    return {"agent": agent, "session": agent_session, "project": project, "path": path, "updated": updated,
            "items": items or [], "error": error}


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _file_list(agent: str, agent_session: str, project, path: str) -> dict:
    updated = _mtime(path)
    try:
        data = _json(path)
        if agent == "todowrite" and isinstance(data, dict):
            data = data.get("todos")
            where = "todos"
        else:
            where = ""
        return _entry(agent, agent_session, project, path, updated, _items(data, agent, where=where))
    except FormatError as e:
        return _entry(agent, agent_session, project, path, updated, error=f"{path}: {e}")
    except OSError as e:
        return _entry(agent, agent_session, project, path, updated, error=f"{path}: cannot read: {e.strerror or e}")


# -- opencode ------------------------------------------------------------------
def opencode_data_dir(home: str, env: dict) -> str:
    base = env.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")
    return os.path.join(base, "opencode")


def _opencode_session_dirs(data_dir: str) -> dict[str, str]:
    """session id -> its project directory, from the older per-session JSON files."""
    out: dict[str, str] = {}
    for path in glob.glob(os.path.join(glob.escape(data_dir), "storage", "session", "*", "*.json"))[:20000]:
        try:
            info = _json(path)
        except (FormatError, OSError):
            continue
        if isinstance(info, dict) and isinstance(info.get("id"), str) and isinstance(info.get("directory"), str):
            out[info["id"]] = info["directory"]
    return out


def scan_opencode_json(data_dir: str) -> list[dict]:
    paths = glob.glob(os.path.join(glob.escape(data_dir), "storage", "todo", "*.json"))
    paths.sort(key=lambda p: _mtime(p) or 0, reverse=True)
    dirs = _opencode_session_dirs(data_dir) if paths else {}
    out = []
    for path in paths[:MAX_LISTS]:
        agent_session = os.path.basename(path)[: -len(".json")]
        out.append(_file_list("opencode", agent_session, dirs.get(agent_session), path))
    return out


def opencode_databases(data_dir: str) -> list[str]:
    return sorted(p for p in glob.glob(os.path.join(glob.escape(data_dir), "opencode*.db")) if os.path.isfile(p))


_READERS: dict[str, tuple[tuple[int, int], sqlite3.Connection]] = {}
_READERS_LOCK = threading.Lock()


def _uri(db_path: str, query: str) -> str:
    return "file:" + urllib.parse.quote(db_path) + "?" + query


def _file_id(path: str) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _reader(db_path: str, file_id: tuple[int, int, int, int]) -> tuple[sqlite3.Connection, bool]:
    """A read-only connection to db_path that takes no lock opencode could meet, and whether it is kept.

    opencode 1.18 runs `PRAGMA journal_mode = WAL` before it sets a busy timeout, so any lock held at that moment
    ends its start with "database is locked". Three cases, by what lies beside the file:
    - a `-shm` (a live opencode, or one that died): `readonly_shm=1`, which never runs WAL recovery nor takes the
      exclusive locks of the first connection; kept open, since a connection that closes as the last one tries
      an exclusive lock for its checkpoint (a reader that closed at each poll failed 6 to 35 starts of 300-400);
    - neither `-shm` nor `-wal` (no opencode has it open, everything is in the file): `immutable=1`, no lock at
      all; read once and closed (the caller checks that the file did not change during the read);
    - a `-wal` alone, still there after 0.3 s (a closing opencode deletes its `-shm` first, then its `-wal`; one
      that died may leave a `-wal`): a plain read-only connection, kept.
    One kept connection per file (file_id: its `_file_id`); a replaced file gets its own. Called with
    _READERS_LOCK held."""
    inode = file_id[:2]
    known = _READERS.get(db_path)
    if known is not None and known[0] == inode:
        return known[1], True
    if known is not None:
        del _READERS[db_path]
        known[1].close()   # the replaced file's: its locks are on the old inode, no opencode's
    for look in range(6):
        if os.path.exists(db_path + "-shm"):
            query = "mode=ro&readonly_shm=1"
            break
        if not os.path.exists(db_path + "-wal"):
            return sqlite3.connect(_uri(db_path, "immutable=1"), uri=True, check_same_thread=False), False
        query = "mode=ro"
        time.sleep(0.02 * look)   # a closing opencode deletes its -shm first, then its -wal
    con = sqlite3.connect(_uri(db_path, query), uri=True, timeout=2.0, check_same_thread=False)
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()   # opens the -shm now: it may have gone
    except sqlite3.Error:
        con.close()
        raise
    _READERS[db_path] = (inode, con)
    return con, True


def read_opencode_db(db_path: str, agent_session: str | None = None) -> list[dict]:
    """Every session's todo list in one opencode database (or one session's).

    A read that met opencode starting or stopping (its `-shm` gone between look and open, the file written during
    a lock-free read) is read again, up to three times."""
    error = f"{db_path}: changed during each of 3 reads"
    with _READERS_LOCK:
        for _ in range(3):
            try:
                before = _file_id(db_path)
                con, kept = _reader(db_path, before)
            except (OSError, sqlite3.Error) as e:
                error = f"{db_path}: cannot open: {e}"
                continue
            try:
                out = _read_opencode_db(con, db_path, agent_session)
            except sqlite3.Error as e:
                error = f"{db_path}: cannot read: {e}"
                if kept:
                    del _READERS[db_path]
                con.close()
                continue
            if kept:
                return out
            con.close()
            try:
                if _file_id(db_path) == before and not os.path.exists(db_path + "-wal"):
                    return out
            except OSError as e:
                error = f"{db_path}: cannot open: {e}"
    return [_entry("opencode", "?", None, db_path, _mtime(db_path), error=error)]


def _read_opencode_db(con: sqlite3.Connection, db_path: str, agent_session: str | None) -> list[dict]:
    """The todo lists in the database behind con (sqlite3.Error: the caller reads again)."""
    cols = {r[1] for r in con.execute("PRAGMA table_info(todo)")}
    need = {"session_id", "content", "status", "priority", "position"}
    if not cols:
        return []
    if not need <= cols:
        missing = ", ".join(sorted(need - cols))
        return [_entry("opencode", "?", None, db_path, _mtime(db_path),
                       error=f"{db_path}: table todo: missing column {missing} (a newer opencode format?)")]
    when = "max(t.time_updated)" if "time_updated" in cols else "NULL"
    scols = {r[1] for r in con.execute("PRAGMA table_info(session)")}
    join = "session" in {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    directory = "s.directory" if join and "directory" in scols else "NULL"
    sql = (f"SELECT t.session_id, {directory}, {when} FROM todo t "
           + ("LEFT JOIN session s ON s.id = t.session_id " if directory != "NULL" else "")
           + ("WHERE substr(t.session_id, 1, ?) = ? " if agent_session else "")
           + "GROUP BY t.session_id ORDER BY 3 DESC LIMIT ?")
    params = (len(agent_session), agent_session, MAX_LISTS) if agent_session else (MAX_LISTS,)
    sessions = con.execute(sql, params).fetchall()
    out = []
    for sid, project, updated_ms in sessions:
        rows = con.execute("SELECT content, status, priority FROM todo WHERE session_id = ? ORDER BY position",
                           (sid,)).fetchall()
        data = [{"content": c, "status": s, "priority": p} for c, s, p in rows]
        updated = updated_ms / 1000.0 if isinstance(updated_ms, (int, float)) else _mtime(db_path)
        where = f"todo(session_id={sid})"
        try:
            out.append(_entry("opencode", str(sid), project, db_path, updated,
                              _items(data, "opencode", where=where)))
        except FormatError as e:
            out.append(_entry("opencode", str(sid), project, db_path, updated, error=f"{db_path}: {e}"))
    return out


# -- Claude Code ---------------------------------------------------------------
def claude_dir(home: str, env: dict) -> str:
    """`~/.claude`, or `$CLAUDE_CONFIG_DIR` where it is set (it moves every file Claude Code keeps)."""
    return env.get("CLAUDE_CONFIG_DIR") or os.path.join(home, ".claude")


def _regular_fd(path: str) -> int | None:
    """An open descriptor of a regular file (a FIFO here must not block the scan), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    return None


def _cwd_of(transcript: str) -> str | None:
    """The working directory of a Claude Code session: the first `cwd` in its transcript's first MiB."""
    fd = _regular_fd(transcript)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        head = f.read(1 << 20)
    for line in head.split(b"\n"):
        if b'"cwd"' not in line:
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("cwd"), str):
            return rec["cwd"]
    return None


def _claude_project(cdir: str, agent_session: str) -> str | None:
    """The directory a session ran in, from its transcript (a list named otherwise has none)."""
    for path in glob.glob(os.path.join(glob.escape(os.path.join(cdir, "projects")), "*",
                                       glob.escape(agent_session) + ".jsonl"))[:1]:
        return _cwd_of(path)
    return None


def _task_doc(path: str, waits: list[int]):
    """One task file; caught half-written (the client writes it in place) it is read again before it errs,
    while the scan's `waits` last."""
    for attempt in range(REREAD_TRIES):
        try:
            return _json(path)
        except Unfinished:
            if attempt == REREAD_TRIES - 1 or waits[0] <= 0:
                raise
            waits[0] -= 1
            time.sleep(REREAD_S)


def _task_order(path: str):
    stem = os.path.basename(path)[: -len(".json")]
    return (0, int(stem), "") if re.fullmatch(r"[0-9]{1,18}", stem) else (1, 0, stem)


def _task_list(cdir: str, list_dir: str, waits: list[int]) -> dict:
    """One Task-tool list: its task files in id order; a file deleted meanwhile (TaskUpdate deleted) is gone."""
    list_id = os.path.basename(list_dir)
    paths = sorted(glob.glob(os.path.join(glob.escape(list_dir), "*.json")), key=_task_order)
    updated = max([t for t in map(_mtime, [list_dir, *paths[:MAX_TASKS]]) if t is not None], default=None)
    entry = _entry("claude", list_id, _claude_project(cdir, list_id), list_dir, updated)
    if len(paths) > MAX_TASKS:
        entry["error"] = f"{list_dir}: more than {MAX_TASKS} task files"
        return entry
    items = []
    for path in paths:
        try:
            items.append(_item(_task_doc(path, waits), "", title="subject"))
        except FileNotFoundError:
            continue
        except FormatError as e:
            entry["error"] = f"{path}: {e}"
            return entry
        except OSError as e:
            entry["error"] = f"{path}: cannot read: {e.strerror or e}"
            return entry
    entry["items"] = items
    return entry


def _lines_from_end(f, size: int, limit: int):
    """The file's lines, last first, from at most `limit` bytes of its end (a line cut there is not given)."""
    pos, rest, read = size, b"", 0
    while pos > 0 and read < limit:
        n = min(1 << 20, pos, limit - read)
        pos -= n
        f.seek(pos)
        lines = (f.read(n) + rest).split(b"\n")
        read += n
        rest = lines[0]
        yield from reversed(lines[1:])
    if pos == 0:
        yield rest


def _when(stamp) -> float | None:
    if not isinstance(stamp, str) or len(stamp) > 40:
        return None
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _todowrite(rec, refused: set) -> list | None:
    """The todos a transcript record sets: the tool's result (`newTodos`), or the model's TodoWrite call while
    its result is not written yet; None when the record sets none (a call the client refused sets none)."""
    if not isinstance(rec, dict) or rec.get("isSidechain") is True or not isinstance(rec.get("message"), dict):
        return None
    content = rec["message"].get("content")
    blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
    if rec.get("type") == "user":
        refused.update(b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result" and b.get("is_error"))
        result = rec.get("toolUseResult")
        return result["newTodos"] if isinstance(result, dict) and "newTodos" in result else None
    if rec.get("type") == "assistant":
        for b in reversed(blocks):
            if b.get("type") == "tool_use" and b.get("name") == "TodoWrite" and b.get("id") not in refused:
                return b["input"].get("todos") if isinstance(b.get("input"), dict) else None
    return None


_TODO_WORDS = (b"TodoWrite", b"newTodos", b"is_error")   # a line without them sets no todo list


def _transcript_list(f, size: int, path: str) -> dict | None:
    """The last TodoWrite list in the last TRANSCRIPT_BYTES of one open transcript (None: it has none)."""
    refused: set = set()
    for line in _lines_from_end(f, size, TRANSCRIPT_BYTES):
        if not any(w in line for w in _TODO_WORDS):
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue                               # the line the client is writing now, or not JSON
        todos = _todowrite(rec, refused)
        if todos is None:
            continue
        when, cwd = _when(rec.get("timestamp")), rec.get("cwd")
        entry = _entry("claude", os.path.basename(path)[: -len(".jsonl")], cwd if isinstance(cwd, str) else None,
                       path, when if when is not None else _mtime(path))
        try:
            entry["items"] = _items(todos, "claude", where="TodoWrite.todos")
        except FormatError as e:
            entry["error"] = f"{path}: {e}"
        return entry
    return None


_SEARCHED: dict = {}
"""transcript path -> (inode, bytes searched, its list). A transcript only grows: one that grew by lines without a
todo word keeps its list, so following a session does not search its whole transcript at every poll."""


def _transcript(path: str, ino: int) -> tuple[dict | None, int]:
    """One transcript's last TodoWrite list, and the bytes it is searched to (up to its last complete line)."""
    fd = _regular_fd(path)
    if fd is None:
        return None, 0
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        f.seek(max(0, size - (1 << 16)))
        tail = f.read()
        whole = size - len(tail) + tail.rfind(b"\n") + 1 if b"\n" in tail else 0
        cached = _SEARCHED.get(path)
        if cached is not None and cached[0] == ino and cached[1] <= whole:
            f.seek(cached[1])
            grown = f.read(min(whole - cached[1], TRANSCRIPT_BYTES + 1))
            if len(grown) <= TRANSCRIPT_BYTES and not any(w in grown for w in _TODO_WORDS):
                return cached[2], whole
        return _transcript_list(f, size, path), whole


def scan_claude_transcripts(cdir: str, agent_session: str | None = None) -> list[dict]:
    """The last TodoWrite list of each session's transcript, newest transcripts first, within the byte budget."""
    pattern = (glob.escape(agent_session) + "*" if agent_session else "*") + ".jsonl"
    paths = glob.glob(os.path.join(glob.escape(os.path.join(cdir, "projects")), "*", pattern))
    stats = {}
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            continue
        stats[p] = (st.st_ino, st.st_mtime_ns, st.st_size)
    order = sorted(stats, key=lambda p: stats[p][1], reverse=True)[:MAX_LISTS]
    out, budget, left = [], TRANSCRIPT_BUDGET, 0
    for n, path in enumerate(order):
        ino, _, size = stats[path]
        cached = _SEARCHED.get(path)
        if cached is not None and cached[:2] == (ino, size):
            found = cached[2]
        elif min(size, TRANSCRIPT_BYTES) > budget:
            left = len(order) - n
            break
        else:
            budget -= min(size, TRANSCRIPT_BYTES)
            try:
                found, whole = _transcript(path, ino)
            except OSError:
                continue                                 # gone or unreadable since it was listed: not a list
            _SEARCHED[path] = (ino, whole, found)
        if found is not None:
            out.append(found)
    if agent_session is None:
        for gone in set(_SEARCHED) - set(stats):
            del _SEARCHED[gone]
    if left:
        where = os.path.join(cdir, "projects")
        out.append(_entry("claude", "?", None, where, None,
                          error=f"{where}: {left} older transcript{'s' if left > 1 else ''} not searched for a "
                                f"TodoWrite list (this scan read its {TRANSCRIPT_BUDGET >> 20} MiB)"))
    return out


def scan_claude(home: str, env: dict | None = None, agent_session: str | None = None) -> list[dict]:
    """Claude Code's lists: Task-tool lists, the last TodoWrite of each transcript, older clients' files."""
    cdir = claude_dir(home, env or {})
    dirs = [d for d in glob.glob(os.path.join(glob.escape(os.path.join(cdir, "tasks")), "*")) if os.path.isdir(d)]
    if agent_session:
        dirs = [d for d in dirs if os.path.basename(d).startswith(agent_session)]
    dirs.sort(key=lambda d: _mtime(d) or 0, reverse=True)
    waits = [REREAD_WAITS]
    out = [_task_list(cdir, d, waits) for d in dirs[:MAX_LISTS]]
    out.extend(scan_claude_transcripts(cdir, agent_session))
    paths = glob.glob(os.path.join(glob.escape(os.path.join(cdir, "todos")), "*.json"))
    paths.sort(key=lambda p: _mtime(p) or 0, reverse=True)
    for path in paths[:MAX_LISTS]:
        name = os.path.basename(path)[: -len(".json")]
        out.append(_file_list("claude", name, _claude_project(cdir, name.split("-agent-")[0]), path))
    return out


# -- everything ----------------------------------------------------------------
def scan(home: str, env: dict, files=(), agents=("opencode", "claude"), agent_session: str | None = None) -> list[dict]:
    """Every todo list found under home (and the todowrite files named); only `agent_session`'s when given."""
    out: list[dict] = []
    if "opencode" in agents:
        data_dir = opencode_data_dir(home, env)
        for db in opencode_databases(data_dir):
            out.extend(read_opencode_db(db, agent_session))
        out.extend(scan_opencode_json(data_dir))
    if "claude" in agents:
        out.extend(scan_claude(home, env, agent_session))
    for path in files:
        out.append(_file_list("todowrite", path, None, path))
    if agent_session:
        out = [d for d in out if d["agent"] == "todowrite" or str(d["session"]).startswith(agent_session)]
    return out


def signature(home: str, env: dict, files=(), agents=("opencode", "claude")) -> tuple:
    """(path, mtime_ns, size) of every file the lists are read from: unchanged means nothing to re-read."""
    paths: list[str] = list(files)
    if "opencode" in agents:
        data_dir = opencode_data_dir(home, env)
        for db in opencode_databases(data_dir):
            paths += [db, db + "-wal"]
        paths += glob.glob(os.path.join(glob.escape(data_dir), "storage", "todo", "*.json"))
    if "claude" in agents:
        cdir = glob.escape(claude_dir(home, env))
        for pattern in (("todos", "*.json"), ("tasks", "*"), ("tasks", "*", "*.json"), ("projects", "*", "*.jsonl")):
            paths += glob.glob(os.path.join(cdir, *pattern))
    sig = []
    for p in sorted(paths):
        try:
            st = os.stat(p)
        except OSError:
            continue
        sig.append((p, st.st_mtime_ns, st.st_size))
    return tuple(sig)


def main(argv: list[str]) -> int:
    """`python3 scan.py HOME [--agents a,b] [--session S] [FILE...]`: the lists found, as one JSON document."""
    args = list(argv)
    home = args.pop(0) if args else os.path.expanduser("~")
    agents: tuple[str, ...] = ("opencode", "claude")
    agent_session = None
    while args[:1] and args[0] in ("--agents", "--session"):
        flag, value = args.pop(0), args.pop(0)
        if flag == "--agents":
            agents = tuple(a for a in value.split(",") if a)
        else:
            agent_session = value or None
    json.dump({"lists": scan(home, dict(os.environ), args, agents, agent_session)}, sys.stdout)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)   # no interpreter teardown: it would close the kept database connections (see _reader)

"""Find and read coding agents' todo lists on one machine; standard library only.

This module also runs on a node, sent over SSH as `python3 -c` with the home directory
to scan (see ops.agents.discover), so it imports nothing but the standard library and
answers in plain JSON-ready dicts. The formats, from the agents' public sources:

- opencode, older versions: `$XDG_DATA_HOME/opencode/storage/todo/<sessionID>.json`, a JSON
  array of `{id, content, status, priority}`; the session's directory in
  `storage/session/<projectID>/<sessionID>.json` (`directory`, `title`).
- opencode, newer versions: the SQLite database `$XDG_DATA_HOME/opencode/opencode*.db`, table
  `todo(session_id, content, status, priority, position, time_created, time_updated)` and
  table `session(id, directory, title, time_updated, ...)`. Its items have no id.
- Claude Code: `~/.claude/todos/<session>-agent-<agent>.json`, a JSON array of
  `{content, status, activeForm}`; the session's directory is the `cwd` of its transcript
  `~/.claude/projects/<encoded dir>/<session>.jsonl`.
- todowrite files named on the command line: `{"todos": [...]}` or a bare array.

Every list is a dict `{agent, session, project, path, updated, items, error}`; a list that
cannot be read has `error` (one line naming the file and the field) and no items.
"""

from __future__ import annotations

import glob
import json
import os
import sqlite3
import stat
import sys

MAX_BYTES = 16 * 1024 * 1024      # a todo list larger than this is refused, not read
MAX_LISTS = 2000                  # per agent, newest first
STATUSES = {
    "opencode": ("pending", "in_progress", "completed", "cancelled"),
    "claude": ("pending", "in_progress", "completed"),
    "todowrite": ("pending", "in_progress", "completed", "cancelled"),
}


class FormatError(Exception):
    """The file is not in the format its agent writes: the message names the field."""


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


def _json(path: str):
    raw = _read_regular(path)
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise FormatError(f"not UTF-8 text (byte {e.start})") from None
    except ValueError as e:
        raise FormatError(f"invalid JSON (line {getattr(e, 'lineno', '?')}): {getattr(e, 'msg', e)}") from None
    except RecursionError:
        raise FormatError("invalid JSON: arrays or objects nested too deeply") from None


def _items(data, agent: str, *, where: str = "") -> list[dict]:
    """Check and normalise one agent's array of items."""
    if not isinstance(data, list):
        raise FormatError(f"{where or 'top level'}: expected an array of todo items, got {type(data).__name__}")
    allowed = STATUSES[agent]
    out = []
    for n, item in enumerate(data):
        at = f"{where}[{n}]"
        if not isinstance(item, dict):
            raise FormatError(f"{at}: expected an object, got {type(item).__name__}")
        content = item.get("content")
        if not isinstance(content, str) or not content.strip():
            raise FormatError(f"{at}.content: expected a non-empty string")
        if any((c < " " and c not in "\n\t") or "\ud800" <= c <= "\udfff" for c in content):
            raise FormatError(f"{at}.content: control characters or lone surrogates in the text")
        status = item.get("status")
        if status not in allowed:
            raise FormatError(f"{at}.status: expected one of {', '.join(allowed)}, got {str(status)[:40]!r}")
        priority = item.get("priority")
        if priority is not None and priority not in ("high", "medium", "low"):
            raise FormatError(f"{at}.priority: expected high, medium or low, got {str(priority)[:40]!r}")
        active = item.get("activeForm")
        if agent == "claude" and (not isinstance(active, str) or not active.strip()):
            raise FormatError(f"{at}.activeForm: expected a non-empty string")
        tid = item.get("id")
        if tid is not None and (isinstance(tid, bool) or not isinstance(tid, (str, int))):
            raise FormatError(f"{at}.id: expected a string or integer")
        out.append({"id": None if tid is None else str(tid), "content": content, "status": status,
                    "priority": priority, "active_form": active if isinstance(active, str) else None})
    return out


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


def read_opencode_db(db_path: str, agent_session: str | None = None) -> list[dict]:
    """Every session's todo list in one opencode database (or one session's)."""
    try:
        con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=2.0)
    except sqlite3.Error as e:
        return [_entry("opencode", "?", None, db_path, _mtime(db_path), error=f"{db_path}: cannot open: {e}")]
    try:
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
    except sqlite3.Error as e:
        return [_entry("opencode", "?", None, db_path, _mtime(db_path), error=f"{db_path}: cannot read: {e}")]
    finally:
        con.close()


# -- Claude Code ---------------------------------------------------------------
def _claude_project(home: str, agent_session: str) -> str | None:
    """The working directory of a Claude Code session, from the first line of its transcript that has one."""
    for path in glob.glob(os.path.join(glob.escape(os.path.join(home, ".claude", "projects")), "*",
                                       glob.escape(agent_session) + ".jsonl"))[:1]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)     # a FIFO here must not block the scan
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                return None
            with os.fdopen(fd, "rb") as f:
                for _ in range(50):
                    line = f.readline(1 << 20)
                    if not line:
                        break
                    try:
                        rec = json.loads(line)
                    except (ValueError, RecursionError):
                        continue
                    if isinstance(rec, dict) and isinstance(rec.get("cwd"), str):
                        return rec["cwd"]
        except OSError:
            return None
    return None


def scan_claude(home: str) -> list[dict]:
    paths = glob.glob(os.path.join(glob.escape(os.path.join(home, ".claude", "todos")), "*.json"))
    paths.sort(key=lambda p: _mtime(p) or 0, reverse=True)
    out = []
    for path in paths[:MAX_LISTS]:
        name = os.path.basename(path)[: -len(".json")]
        agent_session = name.split("-agent-")[0]
        out.append(_file_list("claude", name, _claude_project(home, agent_session), path))
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
        out.extend(scan_claude(home))
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
        paths += glob.glob(os.path.join(glob.escape(os.path.join(home, ".claude", "todos")), "*.json"))
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
    sys.exit(main(sys.argv[1:]))

"""Evaluate verify checks through a node's Host, each to a one-line result.

Everything is read or run on the node itself (stat, grep, curl), so a check
means the same on LocalHost and over SSH. A check that cannot be evaluated
(file missing, command error, timeout) fails with the reason as its text;
only HostUnreachable propagates, because then nothing about the stage is known.
"""

from __future__ import annotations

import http.client
import json
import math
import posixpath
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

from ops import nodejson, nodenum
from ops.errors import HostError, HostTimeout, HostUnreachable
from ops.hosts.base import Host
from ops.hosts.local import LocalHost
from ops.plan.records import CheckSpec
from ops.run.views import CheckResult
from ops.textsafe import last_line, printable
from ops.units import human_bytes

OK, BAD = "✓", "✗"
FRESH_SLACK_S = 2.0          # clock granularity allowance for `fresh` outputs
JSON_TAIL = 256 * 1024       # bytes read from the end of a JSONL file for line = "last"
LOG_TAIL = 1 << 20
"""Bytes searched by the Python fallback of log_contains (the node's grep failed), a line at a time, each line's
first LINE_SEARCHED characters: a pattern that backtracks costs at most that squared per line, and the GIL is
let go between lines (over the whole tail at once, a node's 16 MB line of digits took hours)."""
LINE_SEARCHED = 4096


@dataclass
class CheckContext:
    """What a check needs to know about the stage run it verifies."""

    host: Host
    base_dir: str | None = None                  # relative paths are relative to this (stage cwd or root)
    log_path: str | None = None                  # the run's log
    log_offset: int = 0                          # where this run's output starts in it (logs are appended)
    started_at: float | None = None              # node-clock start of the run (for `fresh` outputs)
    tmux_session: str | None = None              # the run's tmux session
    alive: Callable[[str], bool] | None = None   # tmux session -> the runner sees its process alive
    not_own: Callable[[str], str | None] | None = None
    """A server's: url -> who answers there when that is not a process of its run (ops.run.ports.not_own)."""

    def path(self, p: str) -> str:
        if posixpath.isabs(p) or not self.base_dir:
            return p
        return posixpath.join(self.base_dir, p)


def run_checks(specs, ctx: CheckContext) -> tuple[CheckResult, ...]:
    return tuple(run_check(s, ctx) for s in specs)


def run_check(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    fn = _KINDS[spec.kind]
    try:
        ok, observed = fn(spec.args, ctx)
    except HostUnreachable:
        raise
    except HostTimeout as e:
        ok, observed = False, f"timed out ({e})"
    except HostError as e:
        ok, observed = False, f"error: {e}"
    text = f"{spec.describe()}: {observed} {OK if ok else BAD}".replace("\n", " ")
    return CheckResult(spec.kind, ok, text, time.time())


def node_now(host: Host) -> float:
    """The node's clock (mtimes on the node are compared with it, not with ours)."""
    if isinstance(host, LocalHost):
        return time.time()
    res = host.run(["date", "+%s.%N"], timeout=15).check()
    try:
        return nodenum.UNIX_TIME.parse(res.text)
    except nodenum.Invalid as e:
        raise HostError(f"{host.name}: date printed no clock: {e}") from None


# -- kinds ----------------------------------------------------------------------
def _file_exists(a, ctx):
    path = ctx.path(a["path"])
    st = ctx.host.stat(path)
    if st is None:
        return False, "missing"
    return _fresh(a, st, ctx, f"{'dir' if st.is_dir else 'file'}, {human_bytes(st.size)}")


def _fresh(a, st, ctx, observed):
    if a.get("fresh") and ctx.started_at is not None and st.mtime < ctx.started_at - FRESH_SLACK_S:
        return False, f"{observed}, but older than this run (not rewritten)"
    return True, observed


def _min_bytes(a, ctx):
    st = ctx.host.stat(ctx.path(a["path"]))
    if st is None:
        return False, "missing"
    if st.size < a["min"]:
        return False, f"{st.size} bytes"
    return _fresh(a, st, ctx, f"{st.size} bytes")


def _count(text: str, what: str) -> int:
    """A count the node printed (ops.nodenum); HostError when it is none."""
    try:
        return nodenum.COUNT.named(what).parse(text.strip() or "0")
    except nodenum.Invalid as e:
        raise HostError(str(e)) from None


def _min_lines(a, ctx):
    path = ctx.path(a["path"])
    st = ctx.host.stat(path)
    if st is None:
        return False, "missing"
    # non-empty lines, counting a last line without newline (a JSONL record count)
    res = ctx.host.run(["grep", "-a", "-c", "-e", ".", "--", path], timeout=600)
    if res.returncode not in (0, 1):
        return False, f"error: {res.stderr.decode(errors='replace').strip()[:120]}"
    n = _count(res.text, "line count")
    if n < a["min"]:
        return False, f"{n} lines"
    return _fresh(a, st, ctx, f"{n} lines")


_GLOB_SCRIPT = 'shopt -s nullglob globstar; IFS=; m=($1); printf %s "${#m[@]}"'


def _glob_count(a, ctx):
    pattern = ctx.path(a["pattern"])
    res = ctx.host.run(["bash", "-c", _GLOB_SCRIPT, "glob", pattern], timeout=120)
    if not res.ok:
        return False, f"error: {res.stderr.decode(errors='replace').strip()[:120]}"
    n = _count(res.text, "match count")
    return n >= a["min"], f"{n} match{'es' if n != 1 else ''}"


def _log_path(a, ctx) -> str | None:
    p = a.get("path") or ctx.log_path
    return ctx.path(p) if p else None


_GREP_FROM = 'tail -c +"$(( $1 + 1 ))" -- "$2" | grep -a -c -m 1 -P -e "$3"'


def _log_stat(a, ctx):
    """(path, stat) of the log a check reads, or (None, why not)."""
    path = _log_path(a, ctx)
    if path is None:
        return None, "the stage has no log"
    st = ctx.host.stat(path)
    return (path, st) if st is not None else (None, "log missing")


def _log_contains(a, ctx):
    path, st = _log_stat(a, ctx)
    if path is None:
        return False, st
    # only this run's part of the stage's own log counts (an old run's line proves nothing)
    offset = ctx.log_offset if not a.get("path") and st.size >= ctx.log_offset else 0
    if offset:
        res = ctx.host.run(["bash", "-c", _GREP_FROM, "grep", str(offset), path, a["pattern"]], timeout=300)
    else:
        res = ctx.host.run(["grep", "-a", "-c", "-m", "1", "-P", "-e", a["pattern"], "--", path], timeout=300)
    if res.returncode in (0, 1):
        found = res.returncode == 0
    else:  # grep without PCRE on the node: search the log's tail here
        start = max(offset, st.size - LOG_TAIL)
        data = ctx.host.read_range(path, start, LOG_TAIL).decode(errors="replace")
        pattern = re.compile(a["pattern"])
        found = any(pattern.search(line[:LINE_SEARCHED]) for line in data.split("\n"))
    return found, "found" if found else f"not found in {human_bytes(st.size - offset)}"


def _log_advancing(a, ctx):
    path, st = _log_stat(a, ctx)
    if path is None:
        return False, st
    age = node_now(ctx.host) - st.mtime
    return age <= a["within"], f"last write {max(age, 0):.0f}s ago"


def _process_alive(a, ctx):
    tmux_session = a.get("session") or ctx.tmux_session
    if tmux_session is None or ctx.alive is None:
        return False, "no run to look at"
    alive = ctx.alive(tmux_session)
    return alive, f"{tmux_session} {'alive' if alive else 'not running'}"


_CURL = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time"]
_PY_HTTP = (
    "import sys,urllib.request,urllib.error\n"
    "try: print(urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).status)\n"
    "except urllib.error.HTTPError as e: print(e.code)\n"
    "except Exception as e: print('error', e); sys.exit(1)\n"
)


def _http_ok(a, ctx):
    url, timeout = a["url"], float(a["timeout"])
    if isinstance(ctx.host, LocalHost):
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                code = r.status
        except urllib.error.HTTPError as e:
            code = e.code
        except (OSError, ValueError, http.client.HTTPException) as e:   # HTTPException: not HTTP (an ssh banner)
            return False, f"no answer ({getattr(e, 'reason', e)})"
        return _answered(ctx, url, code == 200, f"HTTP {code}")
    # a server binds to the node's localhost: ask from the node itself
    res = ctx.host.run([*_CURL, f"{timeout:g}", url], timeout=timeout + 15)
    if res.returncode == 127:
        res = ctx.host.run(["python3", "-c", _PY_HTTP, url, f"{timeout:g}"], timeout=timeout + 15)
    code = res.text.strip()
    if not res.ok or not re.fullmatch("[1-5][0-9][0-9]", code):   # curl's 000: no answer
        said = last_line(res.stderr, 120) or printable(code, 120) or f"exit {res.returncode}"
        return False, f"no answer ({said})"
    return _answered(ctx, url, code == "200", f"HTTP {code}")


def _answered(ctx: CheckContext, url: str, ok: bool, observed: str) -> tuple[bool, str]:
    """An answer counts for a server only when a process of its own run gave it."""
    other = ctx.not_own(url) if ctx.not_own is not None else None
    if other is None:
        return ok, observed
    return False, f"{observed} from {other}, not this stage's server"


def _json_doc(a, ctx) -> tuple[Any, str] | tuple[None, str]:
    """The JSON object to look in: a whole JSON file, or a line of a JSONL file."""
    path = ctx.path(a["path"])
    st = ctx.host.stat(path)
    if st is None:
        return None, "missing"
    line = a.get("line", "last")
    if st.size <= JSON_TAIL and line in ("last", "first"):
        data = ctx.host.read_range(path, 0, JSON_TAIL).decode(errors="replace")
        try:
            return nodejson.loads(data), ""
        except ValueError:
            pass
        rows = data.splitlines()
    elif line == "last":
        data = ctx.host.read_range(path, max(0, st.size - JSON_TAIL), JSON_TAIL).decode(errors="replace")
        rows = data.splitlines()[1:] if st.size > JSON_TAIL else data.splitlines()
    elif line == "first":
        rows = ctx.host.read_range(path, 0, JSON_TAIL).decode(errors="replace").splitlines()[:-1]
    else:
        res = ctx.host.run(["sed", "-n", f"{int(line)}{{p;q}}", "--", path], timeout=300)
        rows = res.text.splitlines()
    parsed = []
    for r in rows if line != "last" else reversed(rows):
        r = r.strip()
        if not r:
            continue
        try:
            parsed.append(nodejson.loads(r))
            break
        except ValueError:
            continue  # a line being written, or not JSON: use the neighbouring one
    if not parsed:
        return None, "no JSON line"
    return parsed[0], ""


_MISSING = object()


def _field(doc: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and re.fullmatch(r"-?\d+", part) and -len(doc) <= int(part) < len(doc):
            doc = doc[int(part)]
        else:
            return _MISSING
    return doc


def _number(x: Any) -> bool:
    """An int or float, not a bool (JSON's true is no number, though Python's True is an int)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _compare(x: Any, op: str, v: Any) -> bool:
    """x (the node's JSON) against v (the plan's); numbers compared as they are, int with float exactly (no
    float() of a 400-digit integer, which overflows)."""
    if op in ("==", "!="):
        return (x == v) == (op == "==")
    if not _number(x) or not _number(v) or isinstance(x, float) and math.isnan(x):
        return False
    return {"<": x < v, "<=": x <= v, ">": x > v, ">=": x >= v}[op]


def _json_field(a, ctx):
    doc, why = _json_doc(a, ctx)
    if doc is None:
        return False, why
    value = _field(doc, a["field"])
    if value is _MISSING:
        return False, f"no field {a['field']}"
    shown = f"{value:.6g}" if isinstance(value, float) else json.dumps(value)[:60]
    return _compare(value, a["op"], a["value"]), shown


def _command_ok(a, ctx):
    res = ctx.host.run(["bash", "-c", a["command"]], timeout=float(a["timeout"]), cwd=ctx.base_dir)
    if res.ok:
        return True, "exit 0"
    return False, f"exit {res.returncode}" + (f": {line}" if (line := last_line(res.stderr or res.stdout, 120)) else "")


_KINDS: dict[str, Callable[[Any, CheckContext], tuple[bool, str]]] = {
    "file_exists": _file_exists,
    "min_bytes": _min_bytes,
    "min_lines": _min_lines,
    "glob_count": _glob_count,
    "log_contains": _log_contains,
    "log_advancing": _log_advancing,
    "process_alive": _process_alive,
    "http_ok": _http_ok,
    "json_field": _json_field,
    "command_ok": _command_ok,
}

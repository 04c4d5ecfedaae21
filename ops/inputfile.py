"""Reading a user's input file (plan, nodes.toml, todo list) safely: bounded in size and nesting.

A FIFO, a device or a directory is refused before anything is read (a FIFO would block forever),
a file over the size cap is refused after reading at most cap + 1 bytes, and parsed data nested
deeper than `MAX_DEPTH` is refused: every case is one `UserError` line naming the file.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from ops.errors import UserError

MAX_BYTES = 4 << 20
"""Plans, node configs and todo lists are small text files; 4 MiB is far above any real one."""

MAX_DEPTH = 32
"""Arrays and tables nest a few levels in a real file; deeper is a mistake or an attack."""

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def read_input(path: str | Path, what: str, limit: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; else UserError `PATH: cannot read WHAT: why`.

    Opened non-blocking and checked with fstat before reading, so a FIFO never blocks.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UserError(f"{p}: cannot read {what}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
            raise UserError(f"{p}: cannot read {what}: it is {kind}, not a regular file")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise UserError(f"{p}: cannot read {what}: larger than {limit >> 20} MiB")
        return b"".join(chunks)
    except OSError as e:
        raise UserError(f"{p}: cannot read {what}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def utf8_text(raw: bytes, source: str | Path, error: type[UserError] = UserError) -> str:
    """raw decoded as UTF-8; else `error` naming the line: `SOURCE:LINE: not UTF-8 text (byte offset N)`."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise error(f"{source}:{line}: not UTF-8 text (byte offset {e.start})") from None


def too_deep(data: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether lists and dicts in data nest more than `limit` levels (checked without recursion)."""
    stack = [(data, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (list, dict)):
            if depth >= limit:
                return True
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


def deep_line(text: str, limit: int = MAX_DEPTH) -> int:
    """The line where brackets first nest more than `limit` deep (strings and comments skipped roughly)."""
    depth, line, quote, comment = 0, 1, "", False
    for c in text:
        if c == "\n":
            line += 1
            comment = False
        elif comment:
            continue
        elif quote:
            if c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c == "#":
            comment = True
        elif c in "[{":
            depth += 1
            if depth > limit:
                return line
        elif c in "]}":
            depth -= 1
    return 1


def toml_value_error(text: str, source: str | Path, error: ValueError) -> str:
    """The one line for a ValueError tomllib lets through (not a TOMLDecodeError): an integer with more digits
    than Python converts (`sys.get_int_max_str_digits`, 4300), named with its line."""
    limit = sys.get_int_max_str_digits()
    for n, line in enumerate(text.splitlines(), 1):
        if limit and any(len(m.group().replace("_", "")) > limit for m in re.finditer(r"[0-9][0-9_]*", line)):
            return f"{source}:{n}: an integer of more than {limit} digits (no number here needs that many)"
    return f"{source}: {str(error).splitlines()[0] if str(error) else type(error).__name__}"

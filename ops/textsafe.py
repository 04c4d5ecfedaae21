"""The one rule for text that came from a node or a file on its way to a terminal (CLI and TUI).

A node is not trusted: what it returns may hold terminal escapes (OSC 52 sets the clipboard, OSC 0 the title,
CSI clears the screen), C1 controls (U+009B is a CSI on its own), bidi overrides that reorder what is read,
carriage returns or newlines that forge a line of ours, and lone surrogates that cannot be printed.
`shown` turns every such character into a visible escape (`\\x1b`, `\\u202e`, `\\n`), so the text says what it
held and obeys nothing. Text shown by the TUI is never Rich markup: wrap the result in `rich.text.Text`.
"""

from __future__ import annotations

import re

_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
"""Arabic letter mark, LRM/RLM, the embeddings and overrides, the isolates."""

_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}\u2028\u2029\ud800-\udfff]")
"""Every character `shown` escapes on a single line: C0, DEL, C1, bidi controls, the Unicode line and
paragraph separators (str.splitlines breaks on them), lone surrogates (surrogateescape of bytes that were not UTF-8)."""

_UNSAFE_LINES = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}\u2028\u2029\ud800-\udfff]")
"""The same with newline and tab kept: text of many lines (a log tail)."""


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    o = ord(c)
    return _NAMED.get(c) or (f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}")


def shown(text: object, lines: bool = False) -> str:
    """`text` (anything: str() of it) safe for a terminal: every control, bidi and unprintable character as a
    visible escape. On a single line (the default) newline and tab are escaped too, so no line can be forged;
    with lines=True they are kept (a log's lines), a carriage return is still escaped."""
    s = text if isinstance(text, str) else str(text)
    return (_UNSAFE_LINES if lines else _UNSAFE).sub(_escape, s)


def shown_or(text: object | None, missing: str = "-") -> str:
    """`shown(text)`, or `missing` when there is no text."""
    return missing if text is None else shown(text)


LINE_CHARS = 300
"""The most characters of a tool's line (the last line of its stderr) that a message quotes."""


def printable(text: object, limit: int = LINE_CHARS) -> str:
    """`shown(text)` cut to at most limit characters, ending in "..." when cut; bytes read as UTF-8 (U+FFFD for a
    byte that is not). Only the first limit + 1 characters (of bytes, 4 * (limit + 1)) are ever decoded or escaped:
    a line of any length costs the same."""
    if isinstance(text, bytes):
        text = text[: 4 * (limit + 1)].decode("utf-8", "replace")
    s = shown((text if isinstance(text, str) else str(text))[: limit + 1])
    return s if len(s) <= limit else s[: limit - 3] + "..."


def last_line(data: bytes | str, limit: int = LINE_CHARS) -> str:
    """The last non-blank line of what a tool wrote (its stderr, its output; a line ends at \\n or \\r, as a terminal
    shows it), stripped, as `printable(line, limit)`; "" when there is none."""
    if isinstance(data, str):
        text = data.rstrip()
        return printable(text[max(text.rfind("\n"), text.rfind("\r")) + 1 :].lstrip(), limit)
    raw = data.rstrip()
    return printable(raw[max(raw.rfind(b"\n"), raw.rfind(b"\r")) + 1 :].lstrip(), limit)

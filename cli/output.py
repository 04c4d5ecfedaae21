"""Printing for CLI commands: tables for people, JSON for scripts, and the guard every printed line goes through."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Sequence, TextIO

from ops.textsafe import shown


class TerminalGuard:
    """A text stream that passes what is written through `shown(..., lines=True)`: no escape, control or bidi
    character a node or a file put in a printed text reaches the terminal. `nodedeck run` writes the command's
    bytes to `.buffer` (as ssh would); the CLI's own control codes (a progress bar's carriage return) go to `raw`."""

    def __init__(self, raw: TextIO):
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(shown(text, lines=True))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def raw_stream(stream: TextIO) -> TextIO:
    """The stream under a TerminalGuard, for text of our own that holds a control code on purpose."""
    return stream.raw if isinstance(stream, TerminalGuard) else stream


@contextmanager
def guarded_output() -> Iterator[None]:
    """sys.stdout and sys.stderr behind a TerminalGuard while a command runs."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = TerminalGuard(sys.stdout), TerminalGuard(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def emit_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Columns padded to their widest cell; a cell is one line, whatever its text held (see ops.textsafe)."""
    rows = [["" if v is None else shown(v) for v in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        widths = [max(w, len(v)) for w, v in zip(widths, r)]
    line = "  ".join(h.upper().ljust(w) for h, w in zip(headers, widths))
    print(line.rstrip())
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())

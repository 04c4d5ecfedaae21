"""Printing for CLI commands: tables for people, JSON for scripts."""

from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def emit_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    rows = [["" if v is None else str(v) for v in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        widths = [max(w, len(v)) for w, v in zip(widths, r)]
    line = "  ".join(h.upper().ljust(w) for h, w in zip(headers, widths))
    print(line.rstrip())
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())

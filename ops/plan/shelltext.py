"""How plan variables go into shell text (a stage's command, smoke args, a command_ok check).

The rule, for every command string of a plan:

- `${name}` is inserted as one shell word: its value (variables inside it expanded) shell-quoted,
  so a path with a space or a quote stays one argument and never runs as code;
- `${name:raw}` is inserted as the value's text, unquoted: for a variable that holds shell syntax
  or several words on purpose (`--extra ${flags:raw}`);
- `$${name}` is a literal `${name}` (a shell variable, say);
- a `${name}` inside '...' or "..." is an error (the quotes would become part of the value):
  write it outside the quotes.

An argv array (`command = ["python", "x.py", "${input}"]`) becomes a command string in which
each item is exactly one word: literal parts are quoted, variables are inserted quoted, and
`:raw` is refused. Everywhere else (paths, env values, urls, titles) values go in as they are.
"""

from __future__ import annotations

import shlex
from typing import Sequence

from ops.plan.records import VAR_RE

_LITERAL = "$${"


def _split(text: str) -> list[tuple[str, str | None, bool]]:
    """(literal, variable name or None, raw) pieces of text; `$${` stays in the literal."""
    out = []
    pos = 0
    protected = text.replace(_LITERAL, "\0\0\0")
    for m in VAR_RE.finditer(protected):
        out.append((text[pos:m.start()], m.group(1), m.group(0).endswith(":raw}")))
        pos = m.end()
    out.append((text[pos:], None, False))
    return out


def argv_template(argv: Sequence[str]) -> str:
    """A command string equal to argv, item for item, whatever the variables' values are."""
    words = []
    for item in argv:
        parts = []
        for literal, name, _raw in _split(item):
            if literal:
                parts.append(shlex.quote(literal.replace(_LITERAL, "${")).replace("${", _LITERAL))
            if name is not None:
                parts.append(f"${{{name}}}")
        words.append("".join(parts) or "''")
    return " ".join(words)


def raw_refs(text: str) -> list[str]:
    """Names used as `${name:raw}` in text."""
    return [name for _lit, name, raw in _split(text) if name is not None and raw]


def quoted_refs(text: str) -> list[str]:
    """Names of `${name}` references that sit inside '...' or "..." of a shell command string."""
    found = []
    quote = ""          # "", "'" or '"'
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if text.startswith(_LITERAL, i):
            i += len(_LITERAL)
            continue
        if c == "\\" and quote != "'":
            i += 2
            continue
        if c == "$":
            m = VAR_RE.match(text, i)
            if m:
                if quote:
                    found.append(m.group(1))
                i = m.end()
                continue
        if quote and c == quote:
            quote = ""
        elif not quote and c in "'\"":
            quote = c
        i += 1
    return found


def substitute(text: str, value, *, shell: bool) -> str:
    """text with each `${name}` replaced by value(name): shell-quoted when shell (unless `:raw`)."""
    out = []
    for literal, name, raw in _split(text):
        out.append(literal.replace(_LITERAL, "${"))
        if name is not None:
            v = value(name)
            out.append(shlex.quote(v) if shell and not raw else v)
    return "".join(out)

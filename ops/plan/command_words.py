"""The simple commands of a bash command line, as `plan check` reads them: each one's words and the paths
its redirections write (the line split at `&&`, `||`, `;`, `|`, ...; quotes as bash reads them)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", "<(", "|&", ";;"}
_REDIRECTS = {">", ">>", "&>", "&>>", ">|"}


@dataclass(frozen=True)
class SimpleCommand:
    """One command of a command line: its words, and the paths its redirections write."""

    words: tuple[str, ...]
    redirected: tuple[str, ...]


def split_commands(line: str) -> list[SimpleCommand]:
    """The simple commands of a bash command line (split at `&&`, `;`, `|`, ...)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:       # unbalanced quotes: bash would reject it too; nothing to check
        return []
    out: list[SimpleCommand] = []
    words: list[str] = []
    redirected: list[str] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t in _OPERATORS:
            if words:
                out.append(SimpleCommand(tuple(words), tuple(redirected)))
            words, redirected = [], []
        elif t in _REDIRECTS:
            if i + 1 < len(tokens) and tokens[i + 1] not in _OPERATORS:
                redirected.append(tokens[i + 1])
                i += 1
        elif t in ("<", ">&", "<&", "<<", "<<<"):
            i += 1           # the operand is read or is a descriptor, not a path written
        elif t.isdigit() and i + 1 < len(tokens) and tokens[i + 1] in _REDIRECTS | {">&", "<", "<&"}:
            pass             # `2>`: the descriptor number
        else:
            words.append(t)
        i += 1
    if words:
        out.append(SimpleCommand(tuple(words), tuple(redirected)))
    return out

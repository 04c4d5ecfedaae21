"""The simple commands of a bash command line, as `plan check` reads them: each one's words and the paths
its redirections write (the line split at `&&`, `||`, `;`, `|`, ...; quotes as bash reads them), the tool
each command runs (`vllm serve`, `sglang.launch_server`, a program under torchrun) and its option words.
`plan check` (ops.plan.lint) and the train-serve checks (ops.served) read commands through these."""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass

_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", "<(", "|&", ";;"}
_REDIRECTS = {">", ">>", "&>", "&>>", ">|"}
ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
"""A leading `NAME=value` word (an environment assignment)."""
PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


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


_TORCHRUN_VALUED = ("--nnodes", "--nproc", "--rdzv", "--max", "--monitor", "--start", "--role", "--node",
                    "--master", "--local", "--log", "--redirects", "--tee", "-r", "-t")


def _torchrun_program(words: tuple[str, ...], n: int) -> int | None:
    """Index of the program torchrun at words[n] launches (after its own options), or None."""
    k = n + 1
    while k < len(words):
        w = words[k]
        if w in ("-m", "--module"):
            return None                                   # a module run by Python: `python -m` rules apply
        if not w.startswith("-"):
            return k
        name = w.partition("=")[0].replace("_", "-")
        takes_value = "=" not in w and any(name == f or name.startswith(f + "-") for f in _TORCHRUN_VALUED)
        k += 2 if takes_value else 1
    return None


def tool_of(words: tuple[str, ...]) -> tuple[str | None, int]:
    """(tool name, index of its first argument) of a command, or (None, 0); a program started by
    torchrun is the tool (`torchrun --nproc-per-node gpu --no-python nodedeck-train ...`)."""
    n = 0
    while n < len(words) and ASSIGN.match(words[n]):
        n += 1
    if n >= len(words):
        return None, 0
    prog = posixpath.basename(words[n])
    if prog == "torchrun":
        k = _torchrun_program(words, n)
        return (posixpath.basename(words[k]), k + 1) if k is not None else (prog, n + 1)
    if PYTHON.match(prog):
        for j in range(n + 1, len(words) - 1):
            if words[j] == "-m":
                return words[j + 1], j + 2
            if not words[j].startswith("-"):
                break
        return None, 0
    if prog == "vllm" and tuple(words[n + 1:n + 3]) == ("bench", "serve"):
        return "vllm bench serve", n + 3
    if prog == "vllm" and n + 1 < len(words) and words[n + 1] == "serve":
        model = n + 2 if n + 2 < len(words) and not words[n + 2].startswith("-") else None
        return "vllm serve", n + 3 if model else n + 2       # vllm serve [MODEL] [flags]
    return prog, n + 1


def flags_of(args: tuple[str, ...]) -> list[tuple[str, str | None]]:
    """(flag, value or None) for each option word of an argument list."""
    out: list[tuple[str, str | None]] = []
    for k, w in enumerate(args):
        if not w.startswith("-") or w == "-" or re.match(r"^-\d", w):
            continue
        name, eq, val = w.partition("=")
        if eq:
            out.append((name, val))
        else:
            nxt = args[k + 1] if k + 1 < len(args) else None
            out.append((name, nxt if nxt is not None and not nxt.startswith("-") else None))
    return out


def vllm_option(name: str) -> str:
    """An option as vLLM's FlexibleArgumentParser rewrites it: `_` -> `-` up to the first dot, no list `+`."""
    if name.startswith("--"):
        head, dot, rest = name[2:].partition(".")
        name = "--" + head.replace("_", "-") + dot + rest
    return name[:-1] if "." in name and name.endswith("+") else name

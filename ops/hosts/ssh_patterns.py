"""OpenSSH's host patterns (match.c): `*` and `?` wildcards, and lists where a matching `!pattern` vetoes.

ssh_config's `Host` and `Match` criteria and known_hosts' host fields all match this way.
"""

from __future__ import annotations

import fnmatch
from typing import Callable, Iterable

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(text: str) -> str:
    """text in lower case as OpenSSH lowers host names and patterns (tolower() byte by byte in the C locale) and
    compares keywords and their values (strcasecmp): A-Z only, every other character as it is (Python's lower()
    would turn a HostName `À` into `à`, and the Kelvin sign in `StrictHostKeyChecking` into `k`)."""
    return text.translate(_ASCII_LOWER)


def match_pattern(name: str, pattern: str) -> bool:
    """OpenSSH's match_pattern: `*` and `?` are the only wildcards (brackets are literal), case-sensitive."""
    return fnmatch.fnmatchcase(name, pattern.replace("[", "[[]"))


def match_pattern_list(name: str, patterns: Iterable[str],
                       match: Callable[[str, str], bool] = match_pattern) -> bool:
    """OpenSSH's match_pattern_list: some pattern matches name and no `!pattern` does."""
    hit = False
    for pat in patterns:
        if pat.startswith("!"):
            if match(name, pat[1:]):
                return False
        elif match(name, pat):
            hit = True
    return hit

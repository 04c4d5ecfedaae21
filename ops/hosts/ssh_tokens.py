"""OpenSSH's expansions in ssh_config values: `~`, `${ENV}` and the %-tokens.

IdentityFile, UserKnownHostsFile, IdentityAgent and `Match exec` take
%%, %C, %d, %h, %i, %k, %L, %l, %n, %p, %r, %u (ssh_config(5) TOKENS);
ProxyCommand takes %%, %h, %n, %p, %r. An unknown token or an undefined
variable is refused, as ssh refuses it.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import socket
from dataclasses import dataclass

from ops.errors import UserError

PATH_TOKENS = frozenset("%CdhikLlnpru")
PROXY_TOKENS = frozenset("%hnpr")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class TokenValues:
    """What the %-tokens stand for, for one destination."""

    host: str  # %h: the HostName actually connected to
    original_host: str  # %n: the name given on the command line
    port: int  # %p
    remote_user: str  # %r
    key_alias: str  # %k: HostKeyAlias, else the original name

    def table(self) -> dict[str, str]:
        me = pwd.getpwuid(os.getuid())
        full = socket.gethostname()
        conn = f"{full}{self.host}{self.port}{self.remote_user}"
        return {
            "%": "%",
            "C": hashlib.sha1(conn.encode("utf-8", "surrogateescape")).hexdigest(),   # the bytes, as ssh hashes them
            "d": me.pw_dir,
            "h": self.host,
            "i": str(os.getuid()),
            "k": self.key_alias,
            "L": full.split(".", 1)[0],
            "l": full,
            "n": self.original_host,
            "p": str(self.port),
            "r": self.remote_user,
            "u": me.pw_name,
        }


def expand_tilde(value: str) -> str:
    """`~` and `~/x` are the local user's home (from the password database, as ssh does); `~user/x` that user's."""
    if not value.startswith("~"):
        return value
    name, sep, rest = value[1:].partition("/")
    try:
        home = pwd.getpwuid(os.getuid()).pw_dir if not name else pwd.getpwnam(name).pw_dir
    except (KeyError, ValueError):    # ValueError: a NUL in the name (no user has one)
        raise UserError(f"{value!r}: no such user {name!r}") from None
    return home.rstrip("/") + "/" + rest if sep else home


def expand(value: str, values: TokenValues, allowed: frozenset[str], *, what: str, env: bool = True) -> str:
    """value with `${ENV}` (when env) and the allowed %-tokens replaced, in one pass like ssh's
    percent_dollar_expand."""
    table = values.table()
    out: list[str] = []
    i = 0
    while i < len(value):
        c = value[i]
        if c == "%":
            token = value[i + 1 : i + 2]
            if not token or token not in allowed:
                raise UserError(f"{what}: unknown token %{token} in {value!r}")
            out.append(table[token])
            i += 2
            continue
        if env and value.startswith("${", i):
            m = _ENV.match(value, i)
            if m is None:
                raise UserError(f"{what}: bad environment expansion in {value!r}")
            if m.group(1) not in os.environ:
                raise UserError(f"{what}: environment variable {m.group(1)} is not set (in {value!r})")
            out.append(os.environ[m.group(1)])
            i = m.end()
            continue
        out.append(c)
        i += 1
    return "".join(out)


def expand_path(value: str, values: TokenValues, *, what: str) -> str:
    """A file name from ssh_config: `~` first, then `${ENV}` and the %-tokens (ssh.c's order)."""
    try:
        home_expanded = expand_tilde(value)
    except UserError as e:
        raise UserError(f"{what}: {e}") from None
    return expand(home_expanded, values, PATH_TOKENS, what=what)

"""A node's SSH target as OpenSSH resolves it: the fields `ssh -G` prints, one `ssh -G` per hop.

OpenSSH reads the ssh config with all its rules (`-F FILE` alone, else ~/.ssh/config then /etc/ssh/ssh_config,
from the home in the password database); nodedeck reads the fields a connection needs from `ssh -G [-F FILE]
[-l USER] [-p PORT] [-J HOPS] -- HOST` and connects with paramiko. A ProxyJump chain `a,b` is resolved as ssh
reaches it: b by `ssh -G -J a b`, a by its own `ssh -G a`. ssh -G prints IdentityFile as written: `~` is
expanded here (as ssh, from the password database), then %-tokens and `${VAR}` by ssh itself (one more `ssh
-G`, given the files as ControlPath, which ssh expands alike). `Match exec` commands run, as ssh runs them,
within SSH_G_TIMEOUT. A config ssh refuses is refused with ssh's own words on one line; what ssh resolves and
nodedeck cannot follow (ProxyUseFdpass, KnownHostsCommand, `ProxyCommand -`) with one line. Each (config file,
host, port) is resolved once per process while the file's bytes stay the same.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from ops import nodenum
from ops.errors import UserError
from ops.textsafe import shown

SSH_G_TIMEOUT = 30.0
MAX_HOPS = 8
NO_SSH = "ssh: not found on PATH (nodedeck reads ssh_config through OpenSSH's `ssh -G`: install the OpenSSH client)"
_CACHE: dict[tuple[str | None, str, int | None, str | None, bytes], SSHTarget] = {}
_CACHE_LOCK = threading.Lock()
_TERMINATING = re.compile(r": terminating, \d+ bad configuration options?$")


@dataclass(frozen=True)
class SSHTarget:
    """Everything needed to open one SSH connection (one hop), as `ssh -G` resolved it."""

    alias: str  # the host as given (ssh's %n)
    config: str | None  # the ssh config file given (`ssh -F`); None: ssh's own
    hostname: str
    port: int
    user: str
    identity_files: tuple[Path, ...]
    identities_only: bool
    user_known_hosts: tuple[Path, ...]
    global_known_hosts: tuple[Path, ...]
    host_key_alias: str | None
    hash_known_hosts: bool
    proxy_jump: tuple[str, ...]  # the jump hosts as ssh -G prints them, first hop first
    proxy_command: str | None
    connect_timeout: float | None
    keepalive: float | None
    strict_host_key_checking: str = "ask"  # as ssh -G prints it: true, false, ask or accept-new
    identity_agent: str | None = None  # None: $SSH_AUTH_SOCK; "none": no agent; else a socket path or `$VAR`
    identity_files_raw: tuple[str, ...] = ()  # as ssh -G prints them, before expansion

    @property
    def address(self) -> str:
        return f"{self.hostname}:{self.port}"

    @property
    def accept_new(self) -> bool:
        return self.strict_host_key_checking in ("accept-new", "false")

    @property
    def known_hosts_name(self) -> str:
        """The name this host's key is stored under in known_hosts (OpenSSH: the alias as is, else [host]:port)."""
        if self.host_key_alias:
            return self.host_key_alias
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    @property
    def cert_principal(self) -> str:
        """The name a host certificate must list among its principals."""
        return self.host_key_alias or self.hostname

    def proxy_command_line(self) -> str:
        """`exec PROXYCOMMAND` with the tokens ssh expands in it (%h %k %n %p %r %%, sshconnect.c), for `sh -c`."""
        table = {"h": self.hostname, "k": self.host_key_alias or self.alias, "n": self.alias,
                 "p": str(self.port), "r": self.user, "%": "%"}

        def token(m: re.Match[str]) -> str:
            if m[1] not in table:
                raise UserError(f"ssh config for {shown(self.alias)}: ProxyCommand: unknown token %{shown(m[1])}")
            return table[m[1]]
        return "exec " + re.sub("%(.?)", token, self.proxy_command or "")


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


def parse_hop(spec: str) -> tuple[str | None, str, int | None]:
    """Split `[user@]host[:port]`, `user@[address]:port` or `ssh://user@host:port` into its parts."""
    s = spec.strip().removeprefix("ssh://").rstrip("/")
    user, _, s = s.rpartition("@")
    host, port = s, None
    if s.startswith("["):
        host, _, rest = s[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
    elif s.count(":") == 1:
        host, _, port = s.partition(":")
    if not host:
        raise UserError(f"{spec!r}: no host name")
    if port is not None and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise UserError(f"{spec!r}: bad port {port!r}")
    return user or None, host, None if port is None else int(port)


def _ssh_g(options: list[str], host: str) -> list[str]:
    """The lines `ssh -G OPTIONS -- HOST` prints; UserError with what ssh says when it refuses the config."""
    try:   # its own session: a Match exec command that does not end is killed with it
        proc = subprocess.Popen(["ssh", "-G", "-T", *options, "--", host], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except FileNotFoundError:
        raise UserError(NO_SSH) from None
    with proc:
        try:
            out, err = proc.communicate(timeout=SSH_G_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise UserError(f"ssh config for {shown(host)}: ssh -G did not finish within {SSH_G_TIMEOUT:g}s "
                            "(a Match exec command that does not end?)") from None
    if proc.returncode != 0:   # each problem on a line, then `FILE: terminating, N bad configuration options`
        said = [shown(line) for line in err.decode("utf-8", "replace").splitlines()
                if line.strip() and not _TERMINATING.search(line)]
        raise UserError(f"ssh config for {shown(host)}: "
                        + ("; ".join(said) or f"ssh -G exited with status {proc.returncode}"))
    return out.decode("utf-8", "surrogateescape").splitlines()


def _identity_files(raw: list[str], options: list[str], host: str) -> tuple[Path, ...]:
    """The files ssh opens for raw (ssh.c load_public_identity_files): `~`, then %-tokens and ${VAR}."""
    try:
        files = [expand_tilde(f) for f in raw if f.lower() != "none"]
    except UserError as e:
        raise UserError(f"ssh config for {shown(host)}: IdentityFile {e}") from None
    if any("%" in f or "$" in f for f in files):
        quoted = "\n".join('"' + f.replace("\\", "\\\\").replace('"', '\\"') + '"' for f in files)
        lines = _ssh_g([*options, "-o", f"ControlPath={quoted}"], host)
        at = next(i for i, line in enumerate(lines) if line.startswith("controlpath "))
        files = [lines[at][len("controlpath "):], *lines[at + 1 : at + len(files)]]
    return tuple(Path(f) for f in files)


_SECONDS = nodenum.Whole("seconds", 1, 10**9)   # ConnectTimeout, ServerAliveInterval: `none` or 0 is unset


def _seconds(value: str | None) -> float | None:
    return None if (n := _SECONDS.get(value)) is None else float(n)


def resolve(spec: str, config: str | Path | None = None, *, port: int | None = None,
            jumps: str | None = None) -> SSHTarget:
    """`alias`, `user@host` or `user@host:port` as `ssh -G` resolves it through config (`ssh -F`; None: ssh's
    own files); port wins over the spec's and the config's (`ssh -p`); jumps: the hops before this one (`ssh -J`).
    Raises UserError (one line) for a config ssh refuses or one nodedeck cannot follow."""
    cfg = None if config is None else expand_tilde(str(config))
    try:   # the file's bytes are part of the key: an edited config is read again (not the files it includes)
        key = (cfg, spec, port, jumps, Path(cfg or expand_tilde("~/.ssh/config")).read_bytes())
    except OSError:
        key = (cfg, spec, port, jumps, b"")
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
    if hit is None:
        hit = _resolve(spec, cfg, port, jumps)
        with _CACHE_LOCK:
            _CACHE[key] = hit
    return hit


def _resolve(spec: str, cfg: str | None, port: int | None, jumps: str | None) -> SSHTarget:
    user, host, spec_port = parse_hop(spec)
    port = port or spec_port
    options = []
    for flag, value in (("-F", cfg), ("-l", user), ("-p", port), ("-J", jumps)):
        if value:
            options += [flag, str(value)]
    lines = _ssh_g(options, host)
    g: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(" ")
        g.setdefault(name, value)
    port = nodenum.PORT.get(g.get("port"))
    if not (g.get("hostname") and g.get("user") and port is not None):
        raise UserError(f"ssh config for {shown(host)}: `ssh -G` printed no hostname, user and port (is the ssh "
                        "on PATH OpenSSH's?)")
    for refused, value in (("ProxyUseFdpass yes", g.get("proxyusefdpass") == "yes"),
                           ("KnownHostsCommand", "knownhostscommand" in g),
                           ("ProxyCommand -", g.get("proxycommand") == "-")):
        if value:
            raise UserError(f"ssh config for {shown(host)}: {refused} is not supported by nodedeck "
                            "(remove it for this host)")
    raw = [line[len("identityfile "):] for line in lines if line.startswith("identityfile ")]

    def listed(name: str) -> tuple[Path, ...]:   # ssh -G (9.2) prints these unquoted: a name with a space splits
        return () if g.get(name, "none") == "none" else tuple(Path(p) for p in g[name].split(" "))

    return SSHTarget(
        alias=host, config=cfg, hostname=g["hostname"], port=port, user=g["user"],
        identity_files=_identity_files(raw, options, host), identities_only=g.get("identitiesonly") == "yes",
        user_known_hosts=listed("userknownhostsfile"), global_known_hosts=listed("globalknownhostsfile"),
        host_key_alias=g.get("hostkeyalias"), hash_known_hosts=g.get("hashknownhosts") == "yes",
        proxy_jump=tuple(g["proxyjump"].split(",")) if "proxyjump" in g else (),
        proxy_command=g.get("proxycommand"), connect_timeout=_seconds(g.get("connecttimeout")),
        keepalive=_seconds(g.get("serveraliveinterval")),
        strict_host_key_checking=g.get("stricthostkeychecking", "ask"), identity_agent=g.get("identityagent"),
        identity_files_raw=tuple(raw),
    )


def next_hop(target: SSHTarget) -> SSHTarget | None:
    """The jump host target is reached through, as ssh reaches it, or None for a direct connection.

    `ProxyJump a,b`: ssh runs `ssh -J a -W HOST:PORT b`: b is resolved with the hops before it as its own
    ProxyJump (replacing its config's proxy settings), a through its own config.
    """
    if not target.proxy_jump:
        return None
    *before, last = target.proxy_jump
    return resolve(last, target.config, jumps=",".join(before) or None)


def jump_chain(target: SSHTarget) -> tuple[SSHTarget, ...]:
    """Every jump host, in the order they are connected (first hop first)."""
    hops: list[SSHTarget] = []
    hop = next_hop(target)
    while hop is not None:
        if len(hops) >= MAX_HOPS:
            raise UserError(f"{shown(target.alias)}: ProxyJump chain longer than {MAX_HOPS} hops (a loop?)")
        hops.append(hop)
        hop = next_hop(hop)
    return tuple(reversed(hops))

"""Reading ~/.ssh/config and resolving a node's SSH target the way OpenSSH does.

paramiko's SSHConfig only parses; this module applies what nodedeck honours:
HostName, User, Port, IdentityFile, IdentitiesOnly, UserKnownHostsFile,
GlobalKnownHostsFile, HostKeyAlias, HashKnownHosts, StrictHostKeyChecking,
ProxyJump, ProxyCommand, ConnectTimeout, ServerAliveInterval, plus Include.
"""

from __future__ import annotations

import getpass
import glob
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import paramiko

from ops.errors import UserError

DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
_MAX_INCLUDE_DEPTH = 16


@dataclass(frozen=True)
class SSHTarget:
    """Everything needed to open one SSH connection (one hop)."""

    alias: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[Path, ...]
    identities_only: bool
    user_known_hosts: tuple[Path, ...]
    global_known_hosts: tuple[Path, ...]
    host_key_alias: str | None
    hash_known_hosts: bool
    accept_new: bool
    proxy_jump: tuple[str, ...]
    proxy_command: str | None
    connect_timeout: float | None
    keepalive: float | None

    @property
    def address(self) -> str:
        return f"{self.hostname}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """The name this host's key is stored under in known_hosts."""
        host = self.host_key_alias or self.hostname
        return host if self.port == 22 else f"[{host}]:{self.port}"


def default_config_path() -> Path:
    return Path("~/.ssh/config").expanduser()


def load_ssh_config(path: str | Path | None = None) -> paramiko.SSHConfig:
    """Parse an ssh_config file (Include expanded); a missing default file is empty."""
    if path is None:
        cfg_path = default_config_path()
        if not cfg_path.exists():
            return paramiko.SSHConfig()
    else:
        cfg_path = Path(path).expanduser()
        if not cfg_path.is_file():
            raise UserError(f"{cfg_path}: ssh config file not found")
    text = _expand_includes(cfg_path, 0)
    try:
        return paramiko.SSHConfig.from_text(text)
    except paramiko.ssh_exception.ConfigParseError as e:
        raise UserError(f"{cfg_path}: {e}") from e


def _expand_includes(path: Path, depth: int) -> str:
    """The text of an ssh_config file with its Include lines replaced by the files they name."""
    if depth > _MAX_INCLUDE_DEPTH:
        raise UserError(f"{path}: Include nested more than {_MAX_INCLUDE_DEPTH} deep")
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise UserError(f"{path}: {e.strerror}") from e
    out = []
    for lineno, line in enumerate(lines, 1):
        m = re.match(r"\s*include(?:\s*=\s*|\s+)(.+)$", line, re.IGNORECASE)
        if not m:
            out.append(line)
            continue
        try:
            patterns = shlex.split(m.group(1))
        except ValueError as e:
            raise UserError(f"{path}:{lineno}: bad Include: {e}") from e
        for pattern in patterns:
            pattern = os.path.expanduser(pattern)
            if not os.path.isabs(pattern):
                pattern = str(Path("~/.ssh").expanduser() / pattern)
            for included in sorted(glob.glob(pattern)):
                if os.path.isfile(included):
                    out.append(_expand_includes(Path(included), depth + 1))
    return "\n".join(out) + "\n"


def parse_hop(spec: str) -> tuple[str | None, str, int | None]:
    """Split `[user@]host[:port]` (or `ssh://user@host:port`) into its parts."""
    s = spec.strip()
    if s.startswith("ssh://"):
        s = s[len("ssh://") :].rstrip("/")
    user = None
    if "@" in s:
        user, s = s.rsplit("@", 1)
        user = user or None
    port = None
    if s.startswith("["):
        host, _, rest = s[1:].partition("]")
        if rest.startswith(":"):
            port = _port(rest[1:], spec)
    elif s.count(":") == 1:
        host, _, p = s.partition(":")
        port = _port(p, spec)
    else:
        host = s
    if not host:
        raise UserError(f"{spec!r}: no host name")
    return user, host, port


def _port(text: str, spec: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise UserError(f"{spec!r}: bad port {text!r}")
    return int(text)


def _paths(values: list[str] | str | None, defaults: tuple[str, ...]) -> tuple[Path, ...]:
    if values is None:
        items = list(defaults)
    elif isinstance(values, str):
        items = shlex.split(values)
    else:
        items = list(values)
    return tuple(Path(os.path.expanduser(v)) for v in items if v.lower() != "none")


def _seconds(value: str | None, key: str, alias: str) -> float | None:
    if value is None:
        return None
    try:
        n = float(value)
    except ValueError:
        raise UserError(f"ssh config for {alias}: {key} {value!r} is not a number") from None
    return n if n > 0 else None


def resolve(
    spec: str,
    config: paramiko.SSHConfig,
    *,
    port: int | None = None,
    user: str | None = None,
) -> SSHTarget:
    """Resolve `alias`, `user@host` or `user@host:port` through the ssh config.

    Explicit user/port (from the spec or the arguments) win over the config,
    like `ssh -p PORT user@host` does.
    """
    spec_user, host, spec_port = parse_hop(spec)
    opts = config.lookup(host)
    config_port = str(opts.get("port", "22"))
    if not config_port.isdigit() or not 0 < int(config_port) < 65536:
        raise UserError(f"ssh config for {host}: bad Port {config_port!r}")
    chosen_port = port or spec_port or int(config_port)
    chosen_user = user or spec_user or opts.get("user") or getpass.getuser()
    jump = opts.get("proxyjump")
    jumps: tuple[str, ...] = ()
    if jump and jump.lower() != "none":
        jumps = tuple(j.strip() for j in jump.split(",") if j.strip())
    proxy_command = opts.get("proxycommand")
    if proxy_command is not None and proxy_command.lower() == "none":
        proxy_command = None
    strict = (opts.get("stricthostkeychecking") or "").lower()
    return SSHTarget(
        alias=host,
        hostname=opts.get("hostname", host),
        port=int(chosen_port),
        user=chosen_user,
        identity_files=_paths(opts.get("identityfile"), DEFAULT_IDENTITIES),
        identities_only=(opts.get("identitiesonly") or "").lower() == "yes",
        user_known_hosts=_paths(opts.get("userknownhostsfile"), DEFAULT_USER_KNOWN_HOSTS),
        global_known_hosts=_paths(opts.get("globalknownhostsfile"), DEFAULT_GLOBAL_KNOWN_HOSTS),
        host_key_alias=opts.get("hostkeyalias"),
        hash_known_hosts=(opts.get("hashknownhosts") or "").lower() == "yes",
        accept_new=strict in ("accept-new", "no", "off"),
        proxy_jump=jumps,
        proxy_command=proxy_command,
        connect_timeout=_seconds(opts.get("connecttimeout"), "ConnectTimeout", host),
        keepalive=_seconds(opts.get("serveraliveinterval"), "ServerAliveInterval", host),
    )

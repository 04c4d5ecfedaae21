"""Reading ssh_config and resolving a node's SSH target the way OpenSSH does.

Semantics follow OpenSSH's readconf.c, checked against `ssh -G` by the tests:
the first obtained value wins (IdentityFile accumulates); `Host` patterns match
the name as given, `Match host` the HostName; `Include` inside a Host/Match
block applies only when that block matches and lines after it stay in the
outer block; `Match final` triggers a second pass where `Host` matches the
HostName; between ProxyJump and ProxyCommand the first one wins. The user file
is read before /etc/ssh/ssh_config; an explicit file (`ssh -F`) alone.

Honoured: HostName, User, Port, IdentityFile, IdentitiesOnly, IdentityAgent,
UserKnownHostsFile, GlobalKnownHostsFile, HostKeyAlias, HashKnownHosts,
StrictHostKeyChecking, ProxyJump, ProxyCommand, ConnectTimeout,
ServerAliveInterval. What nodedeck cannot follow (a Match criterion it does
not evaluate, CanonicalizeHostname, KnownHostsCommand, ProxyUseFdpass) is
refused with one line naming the directive.
"""

from __future__ import annotations

import glob
import os
import pwd
import subprocess
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from ops.errors import UserError
from ops.hosts.ssh_patterns import ascii_lower, match_pattern_list
from ops.hosts.ssh_tokens import PATH_TOKENS, TokenValues, expand, expand_path, expand_tilde

SYSTEM_CONFIG = Path("/etc/ssh/ssh_config")
DEFAULT_IDENTITIES = (
    "~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ecdsa_sk", "~/.ssh/id_ed25519",
    "~/.ssh/id_ed25519_sk", "~/.ssh/id_xmss", "~/.ssh/id_dsa",
)
DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
MAX_INCLUDE_DEPTH = 16
MAX_IDENTITY_FILES = 100
MAX_HOPS = 8
EXEC_TIMEOUT = 30.0
# Keywords whose values are kept (first one wins); the others are read but not applied.
_SINGLE = frozenset({
    "hostname", "user", "port", "identitiesonly", "identityagent", "userknownhostsfile",
    "globalknownhostsfile", "hostkeyalias", "hashknownhosts", "stricthostkeychecking",
    "connecttimeout", "serveraliveinterval",
})
_REFUSED = {  # directives ssh would follow and nodedeck cannot, when they apply to the host
    "canonicalizehostname": lambda v: ascii_lower(v) not in ("no", "false"),
    "knownhostscommand": lambda v: ascii_lower(v) != "none",
    "proxyusefdpass": lambda v: ascii_lower(v) in ("yes", "true"),
}
_MATCH_SUPPORTED = frozenset({"all", "canonical", "final", "exec", "host", "originalhost", "user", "localuser"})


@dataclass(frozen=True)
class SSHTarget:
    """Everything needed to open one SSH connection (one hop), resolved as `ssh -G` would."""

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
    strict_host_key_checking: str = "ask"
    identity_agent: str | None = None  # None: $SSH_AUTH_SOCK; "none": no agent; else a socket path
    identity_files_raw: tuple[str, ...] = ()  # as configured, before expansion (what `ssh -G` prints)

    @property
    def address(self) -> str:
        return f"{self.hostname}:{self.port}"

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


@dataclass(frozen=True)
class _Line:
    path: Path
    lineno: int
    keyword: str  # lowercased
    args: tuple[str, ...]
    rest: str  # the raw text after the keyword (ProxyCommand takes it verbatim)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.lineno}"


def split_args(text: str, where: str) -> list[str]:
    """Split an ssh_config argument list like OpenSSH's argv_split: quotes group, `#` starts a comment."""
    args: list[str] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t":
            i += 1
        if i >= n or text[i] == "#":
            break
        arg: list[str] = []
        quote = None
        while i < n:
            c = text[i]
            if quote is None and c in " \t":
                break
            if c == "\\" and i + 1 < n and (text[i + 1] in "\\\"'" or (quote is None and text[i + 1] == " ")):
                arg.append(text[i + 1])
                i += 2
                continue
            if quote is None and c in "\"'":
                quote = c
            elif c == quote:
                quote = None
            else:
                arg.append(c)
            i += 1
        if quote is not None:
            raise UserError(f"{where}: unterminated quote")
        args.append("".join(arg))
    return args


_PARSED: dict[Path, tuple[bytes, list[_Line]]] = {}
"""The last parse of each file, with the bytes it parsed: a fleet's nodes share one ssh config."""
_PARSED_LOCK = threading.Lock()


def _parse_file(path: Path) -> list[_Line]:
    """The file's directive lines (shared between calls: never changed). Bytes that are not UTF-8 are kept
    as they are (surrogateescape), as OpenSSH keeps them: `ssh -G` reads such a file and prints the bytes back."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: {e.strerror}") from e
    with _PARSED_LOCK:
        parsed = _PARSED.get(path)
    if parsed is not None and parsed[0] == data:
        return parsed[1]
    lines = _parse_text(path, data.decode("utf-8", "surrogateescape"))
    with _PARSED_LOCK:
        _PARSED[path] = (data, lines)
    return lines


def _parse_text(path: Path, text: str) -> list[_Line]:
    lines = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        end = 0
        while end < len(s) and s[end] not in " \t=":
            end += 1
        keyword, rest = s[:end], s[end:].lstrip(" \t")
        if rest.startswith("="):
            rest = rest[1:].lstrip(" \t")
        where = f"{path}:{lineno}"
        lines.append(_Line(path, lineno, ascii_lower(keyword), tuple(split_args(rest, where)), rest))
    return lines


_FLAGS = {
    "hashknownhosts": ("yes", "no", "true", "false"),
    "identitiesonly": ("yes", "no", "true", "false"),
    "stricthostkeychecking": ("yes", "no", "true", "false", "off", "ask", "accept-new"),
}


_ONE_ARG = frozenset({
    "hostname", "user", "port", "identityfile", "identitiesonly", "identityagent", "hostkeyalias",
    "hashknownhosts", "stricthostkeychecking", "connecttimeout", "serveraliveinterval", "proxyjump",
})


def _check_value(line: _Line) -> None:
    """Refuse the values ssh itself refuses when it reads the line (whether or not it applies)."""
    value = line.args[0]
    if line.keyword in _ONE_ARG and len(line.args) > 1:
        raise UserError(f"{line.where}: {line.keyword}: extra arguments at end of line")
    if line.keyword == "port" and not (value.isdigit() and 0 < int(value) < 65536):
        raise UserError(f"{line.where}: bad Port {value!r}")
    allowed = _FLAGS.get(line.keyword)
    if allowed and ascii_lower(value) not in allowed:
        raise UserError(f"{line.where}: {line.keyword} {value!r}: expected one of {', '.join(allowed)}")


def expand_hostname(value: str, host: str) -> str:
    """HostName with %h (the name given) and %% replaced: the only tokens ssh expands there."""
    out, i = [], 0
    while i < len(value):
        if value[i] == "%":
            token = value[i + 1 : i + 2]
            if token not in ("h", "%"):
                raise UserError(f"ssh config for {host}: HostName {value!r}: unknown token %{token}")
            out.append(host if token == "h" else "%")
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def _pattern_list(name: str, patterns: str, *, lower: bool = False) -> bool:
    """A comma-separated pattern list, as the Match criteria give it (host names compared in lower case)."""
    if lower:
        name, patterns = ascii_lower(name), ascii_lower(patterns)
    return match_pattern_list(name, patterns.split(","))


@dataclass
class _Options:
    """Values obtained so far for one destination (first one wins)."""

    values: dict[str, str] = field(default_factory=dict)
    identity_files: list[str] = field(default_factory=list)
    proxy_jump: str | None = None
    proxy_command: str | None = None
    final_host: str | None = None  # the host name the final pass matched (set when there was one)


@dataclass
class _Pass:
    """One pass over the config files for a destination."""

    config: SSHConfig
    host: str  # what `Host` patterns match
    original_host: str
    opts: _Options
    final: bool
    want_final: bool = False

    def run(self) -> None:
        for path, is_user in self.config.files:
            self._file(path, is_user, True, never=False, depth=0)

    def _file(self, path: Path, is_user: bool, active: bool, *, never: bool, depth: int) -> bool:
        for line in self.config.lines(path):
            active = self._line(line, is_user, active, never=never, depth=depth)
        return active

    def _line(self, line: _Line, is_user: bool, active: bool, *, never: bool, depth: int) -> bool:
        kw, args = line.keyword, line.args
        if kw == "host":
            return self._host(args) and not never
        if kw == "match":
            result = self._match(line)
            return result and not never
        if kw == "include":
            self._include(line, is_user, active, never=never, depth=depth)
            return active
        if not args and kw != "proxycommand":
            raise UserError(f"{line.where}: {kw} needs a value")
        _check_value(line)
        if not active:
            return active
        if kw in _REFUSED and _REFUSED[kw](args[0]):
            raise UserError(
                f"{line.where}: {line.keyword} {args[0]} is not supported by nodedeck (remove it for this host)"
            )
        o = self.opts
        if kw == "identityfile":
            if args[0] not in o.identity_files and len(o.identity_files) < MAX_IDENTITY_FILES:
                o.identity_files.append(args[0])
        elif kw == "proxyjump":
            if o.proxy_jump is None and o.proxy_command is None:
                o.proxy_jump = args[0]
                if ascii_lower(args[0]) != "none":
                    o.proxy_command = "none"
        elif kw == "proxycommand":
            if o.proxy_command is None and (o.proxy_jump is None or ascii_lower(o.proxy_jump) == "none"):
                o.proxy_command = line.rest
        elif kw in ("userknownhostsfile", "globalknownhostsfile"):
            o.values.setdefault(kw, " ".join(args))
        elif kw in _SINGLE:
            o.values.setdefault(kw, args[0])
        return active

    def _host(self, args: tuple[str, ...]) -> bool:
        return match_pattern_list(self.host, args)

    def _match(self, line: _Line) -> bool:
        args = list(line.args)
        if not args:
            raise UserError(f"{line.where}: Match needs criteria")
        result = True
        seen: list[str] = []
        while args:
            attr = args.pop(0)
            negate = attr.startswith("!")
            name = ascii_lower(attr[1:] if negate else attr)
            if name not in _MATCH_SUPPORTED:  # localnetwork, tagged, version, command, sessiontype, ...
                raise UserError(
                    f"{line.where}: Match {name} is not supported by nodedeck "
                    f"(it cannot tell whether it matches; remove or rewrite this Match block)"
                )
            if name == "all":
                if args or any(s not in ("canonical", "final") for s in seen):
                    raise UserError(f"{line.where}: Match all cannot be combined with other criteria")
                return result and not negate
            if name in ("canonical", "final"):
                if name == "final":  # any `final` criterion, even negated or in a block that fails (OpenSSH 9.2)
                    self.want_final = True
                if self.final == negate:
                    result = False
                seen.append(name)
                continue
            if not args:
                raise UserError(f"{line.where}: Match {name} needs an argument")
            value = args.pop(0)
            if name == "exec":
                if not result:
                    continue  # ssh skips the command once a criterion failed
                hit = self._exec(value, line)
            elif name == "host":
                hit = _pattern_list(self._match_host(), value, lower=True)
            elif name == "originalhost":
                hit = _pattern_list(self.original_host, value, lower=True)
            elif name == "user":
                hit = _pattern_list(self.opts.values.get("user") or self.config.local_user, value)
            else:  # localuser
                hit = _pattern_list(self.config.local_user, value)
            if hit == negate:
                result = False
            seen.append(name)
        return result

    def _match_host(self) -> str:
        hostname = self.opts.values.get("hostname")
        return expand_hostname(hostname, self.original_host) if hostname else self.original_host

    def _exec(self, command: str, line: _Line) -> bool:
        o = self.opts
        port = int(o.values.get("port", "22"))
        alias = o.values.get("hostkeyalias")
        values = TokenValues(
            host=self._match_host(), original_host=self.original_host, port=port,
            remote_user=o.values.get("user") or self.config.local_user, key_alias=alias or self.original_host,
        )
        cmd = expand(command, values, PATH_TOKENS, what=f"{line.where}: Match exec", env=False)
        shell = os.environ.get("SHELL") or "/bin/sh"
        try:
            done = subprocess.run(
                [shell, "-c", cmd], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, timeout=EXEC_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            raise UserError(f"{line.where}: Match exec {command!r} ran past {EXEC_TIMEOUT:g}s") from None
        except OSError as e:
            raise UserError(f"{line.where}: Match exec: {shell}: {e.strerror}") from e
        return done.returncode == 0

    def _include(self, line: _Line, is_user: bool, active: bool, *, never: bool, depth: int) -> None:
        if depth >= MAX_INCLUDE_DEPTH:
            raise UserError(f"{line.where}: Include nested more than {MAX_INCLUDE_DEPTH} deep")
        if not line.args:
            raise UserError(f"{line.where}: Include needs a file name")
        for arg in line.args:
            if arg.startswith("~"):
                if not is_user:
                    raise UserError(f"{line.where}: bad Include path {arg} (~ only in user files)")
                try:
                    pattern = expand_tilde(arg)
                except UserError as e:
                    raise UserError(f"{line.where}: Include {e}") from None
            elif os.path.isabs(arg):
                pattern = arg
            else:
                base = expand_tilde("~/.ssh") if is_user else str(self.config.system_dir)
                pattern = os.path.join(base, arg)
            for included in sorted(glob.glob(pattern)):
                if os.path.isfile(included):
                    # the included file starts in the including block's state and never changes it
                    self._file(Path(included), is_user, active, never=never or not active, depth=depth + 1)


class SSHConfig:
    """The ssh_config files nodedeck reads, in order: (path, is-a-user-file)."""

    def __init__(self, files: tuple[tuple[Path, bool], ...] = (), *, system_dir: Path = SYSTEM_CONFIG.parent):
        self.files = files
        self.system_dir = system_dir
        self.local_user = pwd.getpwuid(os.getuid()).pw_name  # as ssh: the password database, not $USER
        self._cache: dict[Path, list[_Line]] = {}

    def lines(self, path: Path) -> list[_Line]:
        if path not in self._cache:
            self._cache[path] = _parse_file(path)
        return self._cache[path]

    def options(self, host: str, *, user: str | None = None, port: int | None = None) -> _Options:
        """The values for host as given; user and port (from the command line) come before every file."""
        opts = _Options()
        if user is not None:
            opts.values["user"] = user
        if port is not None:
            opts.values["port"] = str(port)
        first = _Pass(self, host, host, opts, final=False)
        first.run()
        if first.want_final:
            hostname = opts.values.get("hostname")
            opts.final_host = ascii_lower(expand_hostname(hostname, host) if hostname else host)
            opts.values["hostname"] = opts.final_host  # so a HostName in the final pass changes nothing, as in ssh.c
            _Pass(self, opts.final_host, host, opts, final=True).run()
        return opts


def default_config_path() -> Path:
    return Path(expand_tilde("~/.ssh/config"))


def load_ssh_config(path: str | Path | None = None, *, system: Path | None = SYSTEM_CONFIG) -> SSHConfig:
    """The config ssh would read: an explicit file alone (like `ssh -F`), else ~/.ssh/config then system."""
    if path is not None:
        cfg_path = Path(expand_tilde(str(path)))
        if not cfg_path.is_file():
            raise UserError(f"{cfg_path}: ssh config file not found")
        files: tuple[tuple[Path, bool], ...] = ((cfg_path, True),)
    else:
        files = tuple(
            (p, is_user) for p, is_user in ((default_config_path(), True), (system, False))
            if p is not None and p.is_file()
        )
    config = SSHConfig(files, system_dir=(system or SYSTEM_CONFIG).parent)
    for p, _ in files:
        config.lines(p)  # parse errors show up when the config is loaded
    return config


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


def _seconds(value: str | None, key: str, alias: str) -> float | None:
    if value is None:
        return None
    try:
        n = float(value)
    except ValueError:
        raise UserError(f"ssh config for {alias}: {key} {value!r} is not a number") from None
    return n if n > 0 else None


def _yes(value: str | None) -> bool:
    return ascii_lower(value or "") in ("yes", "true")


def _strict(value: str | None) -> str:
    """StrictHostKeyChecking as `ssh -G` prints it: true, false, ask or accept-new."""
    v = ascii_lower(value or "ask")
    return {"yes": "true", "no": "false", "off": "false"}.get(v, v)


def resolve(
    spec: str,
    config: SSHConfig,
    *,
    port: int | None = None,
    user: str | None = None,
) -> SSHTarget:
    """Resolve `alias`, `user@host` or `user@host:port` through the ssh config.

    Explicit user/port (from the spec or the arguments) win over the config,
    like `ssh -p PORT user@host` does.
    """
    spec_user, host, spec_port = parse_hop(spec)
    opts = config.options(host, user=user or spec_user, port=port or spec_port)
    v = opts.values
    hostname = opts.final_host or ascii_lower(expand_hostname(v["hostname"], host) if "hostname" in v else host)
    chosen_port = int(v.get("port", "22"))
    chosen_user = v.get("user") or config.local_user
    alias = ascii_lower(v["hostkeyalias"]) if "hostkeyalias" in v else None
    tokens = TokenValues(hostname, host, chosen_port, chosen_user, alias or host)

    def files(raw: str | None, defaults: tuple[str, ...], key: str, *, expanded: bool) -> tuple[Path, ...]:
        items = list(defaults) if raw is None else split_args(raw, f"ssh config for {host}")
        if [ascii_lower(i) for i in items] == ["none"]:
            return ()
        if not expanded:  # GlobalKnownHostsFile: ssh takes the names as written
            return tuple(Path(i) for i in items)
        return tuple(Path(expand_path(i, tokens, what=f"ssh config for {host}: {key}")) for i in items)

    raw_ids = tuple(opts.identity_files) or DEFAULT_IDENTITIES
    identity_files = tuple(
        Path(expand_path(i, tokens, what=f"ssh config for {host}: IdentityFile")) for i in raw_ids
    )
    jumps: tuple[str, ...] = ()
    if opts.proxy_jump and ascii_lower(opts.proxy_jump) != "none":
        jumps = tuple(j.strip() for j in opts.proxy_jump.split(",") if j.strip())
    proxy_command = opts.proxy_command if jumps == () else None
    if proxy_command is not None and ascii_lower(proxy_command) == "none":
        proxy_command = None
    strict = _strict(v.get("stricthostkeychecking"))
    return SSHTarget(
        alias=host,
        hostname=hostname,
        port=chosen_port,
        user=chosen_user,
        identity_files=identity_files,
        identities_only=_yes(v.get("identitiesonly")),
        user_known_hosts=files(
            v.get("userknownhostsfile"), DEFAULT_USER_KNOWN_HOSTS, "UserKnownHostsFile", expanded=True
        ),
        global_known_hosts=files(
            v.get("globalknownhostsfile"), DEFAULT_GLOBAL_KNOWN_HOSTS, "GlobalKnownHostsFile", expanded=False
        ),
        host_key_alias=alias,
        hash_known_hosts=_yes(v.get("hashknownhosts")),
        accept_new=strict in ("accept-new", "false"),
        proxy_jump=jumps,
        proxy_command=proxy_command,
        connect_timeout=_seconds(v.get("connecttimeout"), "ConnectTimeout", host),
        keepalive=_seconds(v.get("serveraliveinterval"), "ServerAliveInterval", host),
        strict_host_key_checking=strict,
        identity_agent=_agent(v.get("identityagent"), tokens, host),
        identity_files_raw=raw_ids,
    )


def _agent(value: str | None, tokens: TokenValues, host: str) -> str | None:
    """IdentityAgent as ssh uses it: SSH_AUTH_SOCK and `$VAR` stay names, a path is expanded."""
    if value is None:
        return None
    if value == "SSH_AUTH_SOCK" or ascii_lower(value) == "none" or value.startswith("$") and not value.startswith("${"):
        return value
    return expand_path(value, tokens, what=f"ssh config for {host}: IdentityAgent")


def next_hop(target: SSHTarget, config: SSHConfig) -> SSHTarget | None:
    """The jump host target is reached through (with its own way in), or None for a direct connection.

    `ProxyJump a,b`: b is resolved through the config and reached through a; an
    explicit chain replaces b's own proxy settings, as `ssh -J a,b` does.
    """
    if not target.proxy_jump:
        return None
    *before, last = target.proxy_jump
    jump = resolve(last, config)
    if before:
        jump = replace(jump, proxy_jump=tuple(before), proxy_command=None)
    return jump


def jump_chain(target: SSHTarget, config: SSHConfig) -> tuple[SSHTarget, ...]:
    """Every jump host, in the order they are connected (first hop first)."""
    hops: list[SSHTarget] = []
    hop = next_hop(target, config)
    while hop is not None:
        if len(hops) >= MAX_HOPS:
            raise UserError(f"{target.alias}: ProxyJump chain longer than {MAX_HOPS} hops (a loop?)")
        hops.append(hop)
        hop = next_hop(hop, config)
    return tuple(reversed(hops))


def _jump_text(hops: tuple[str, ...]) -> str | None:
    """ProxyJump as `ssh -G` prints it: the earlier hops as written, the last one as [user@]host[:port]."""
    if not hops:
        return None
    user, host, port = parse_hop(hops[-1])
    last = (f"{user}@" if user else "") + host + (f":{port}" if port else "")
    return ",".join((*hops[:-1], last))


@dataclass(frozen=True)
class ResolvedSSH:
    """A target as `nodedeck nodes --resolved` shows it: the fields `ssh -G` prints, under its names."""

    hostname: str
    port: int
    user: str
    identityfile: tuple[str, ...]  # as configured (ssh -G prints them unexpanded)
    identityfile_expanded: tuple[str, ...]  # the files nodedeck reads
    identitiesonly: str
    identityagent: str | None
    proxyjump: str | None
    jumps: tuple[str, ...]  # each jump host as user@hostname:port, first hop first
    proxycommand: str | None
    userknownhostsfile: tuple[str, ...]
    globalknownhostsfile: tuple[str, ...]
    stricthostkeychecking: str
    hashknownhosts: str
    hostkeyalias: str | None

    @classmethod
    def of(cls, t: SSHTarget, jumps: tuple[SSHTarget, ...] = ()) -> "ResolvedSSH":
        """t as shown; jumps: its jump hosts, first hop first (jump_chain)."""
        def listed(paths: tuple[Path, ...]) -> tuple[str, ...]:
            return tuple(str(p) for p in paths) or ("none",)

        return cls(
            hostname=t.hostname,
            port=t.port,
            user=t.user,
            identityfile=t.identity_files_raw,
            identityfile_expanded=tuple(str(p) for p in t.identity_files),
            identitiesonly="yes" if t.identities_only else "no",
            identityagent=t.identity_agent,
            proxyjump=_jump_text(t.proxy_jump),
            jumps=tuple(f"{h.user}@{h.hostname}:{h.port}" for h in jumps),
            proxycommand=t.proxy_command,
            userknownhostsfile=listed(t.user_known_hosts),
            globalknownhostsfile=listed(t.global_known_hosts),
            stricthostkeychecking=t.strict_host_key_checking,
            hashknownhosts="yes" if t.hash_known_hosts else "no",
            hostkeyalias=t.host_key_alias,
        )

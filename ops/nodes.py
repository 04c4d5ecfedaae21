"""The nodes nodedeck knows (nodes.toml) and opening a Host for one.

    [nodes.gpu1]
    ssh = "gpu1"                 # an ~/.ssh/config alias, or user@host[:port]
    port = 22                    # optional, overrides the ssh config
    root = "/data/work"          # pipeline work dir on the node
    ssh_config = "~/.ssh/config" # optional
    watch = ["/data", "/"]       # disk paths to watch
    max_parallel = 4             # stage parallelism
    metrics_url = "http://127.0.0.1:30000/metrics"   # or a list of URLs
    connect_timeout = 10         # seconds, optional
    cost_per_hour = 23.92        # what the node costs, for the fleet's spent and projected cost
    retire_after = "2026-12-05T18:00"   # when it will be shut down: alert while files are not preserved
    on_alert = "notify-send nodedeck \"$NODEDECK_ALERT_MESSAGE\""   # run once per new alert (bash, here)
    alerts = { gpu_idle_s = 300, min_speedup = 1.1 }   # alert thresholds (ops.alerts.model.Thresholds)
    rdzv_host = "10.0.0.1"       # the address other nodes reach this one at, when it is the first of a
                                 # stage's `nodes` (torchrun's rendezvous; default: the ssh HostName)

Node `local` (this machine) always exists; a `[nodes.local]` section may set
its root, watch, max_parallel and metrics_url. A node whose section is wrong is
unusable (its error, `FILE:LINE: ...`, comes when a command names it), while the
other nodes keep working.
"""

from __future__ import annotations

import datetime as dt
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from ops.alerts.model import Thresholds, parse_when
from ops.errors import UserError
from ops.hosts.base import AuditHook, Host
from ops.hosts.local import LocalHost
from ops.inputfile import MAX_DEPTH, deep_line, read_input, toml_value_error, too_deep, utf8_text
from ops.paths import config_dir

LOCAL = "local"
DEFAULT_ROOT = "~/nodedeck-work"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_LOCAL_KEYS = {"root", "watch", "max_parallel", "metrics_url", "cost_per_hour", "retire_after", "on_alert", "alerts",
               "rdzv_host"}
_SSH_KEYS = _LOCAL_KEYS | {"ssh", "port", "ssh_config", "connect_timeout"}


@dataclass(frozen=True)
class NodeConfig:
    """One node from nodes.toml; `ssh` is None for the local machine."""

    name: str
    ssh: str | None = None
    port: int | None = None
    root: str = DEFAULT_ROOT
    ssh_config: str | None = None
    watch_paths: tuple[str, ...] = ("/",)
    max_parallel: int = 4
    metrics_url: tuple[str, ...] = ()
    connect_timeout: float = 10.0
    cost_per_hour: float | None = None
    retire_after: float | None = None          # unix time
    on_alert: str | None = None
    alerts: Thresholds = Thresholds()
    rdzv_host: str | None = None               # how other nodes reach this one (torchrun rendezvous)

    @property
    def kind(self) -> str:
        return "local" if self.ssh is None else "ssh"

    def root_on(self, host: Host) -> str:
        """The work dir as an absolute path on host (a leading ~ is the node user's home)."""
        if self.root == "~" or self.root.startswith("~/"):
            return host.home().rstrip("/") + self.root[1:]
        return self.root

    @property
    def target(self) -> str:
        """What the node points at, for display."""
        if self.ssh is None:
            return "this machine"
        return self.ssh if self.port is None else f"{self.ssh} (port {self.port})"


class Nodes(dict):
    """The usable nodes by name; `errors` holds, by name, the one-line error of each node whose section is wrong."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.errors: dict[str, str] = {}


def default_config_path() -> Path:
    return config_dir() / "nodes.toml"


def _line_of(text: str, node: str | None, key: str | None) -> int | None:
    """The line of `key` in `[nodes.<node>]` (or of the section itself); tomllib has no positions."""
    lines = text.splitlines()
    header = None
    if node is not None:
        rx = re.compile(r"""\s*\[\s*nodes\s*\.\s*(["']?)%s\1\s*\]""" % re.escape(node))
        header = next((i for i, line in enumerate(lines) if rx.match(line)), None)
    if key is None:
        return None if header is None else header + 1
    key_rx = re.compile(r"""\s*(["']?)%s\1\s*=""" % re.escape(key))
    start = 0 if header is None else header + 1
    for i in range(start, len(lines)):
        if header is not None and lines[i].lstrip().startswith("["):
            break
        if key_rx.match(lines[i]):
            return i + 1
    return None if header is None else header + 1


class _Checker:
    """Type checks for one node's table, with file:line in every message."""

    def __init__(self, path: Path, text: str, node: str, table: dict[str, Any]):
        self.path, self.text, self.node, self.table = path, text, node, table

    def _where(self, key: str | None) -> str:
        line = _line_of(self.text, self.node, key) or next(
            (n for n, text in enumerate(self.text.splitlines(), 1) if self.node in text), 1)
        return f"{self.path}:{line}: nodes.{self.node}" + (f".{key}" if key else "")

    def fail(self, key: str | None, message: str) -> UserError:
        return UserError(f"{self._where(key)}: {message}".replace("\n", "\\n").replace("\r", "\\r"))

    @overload
    def str_(self, key: str, default: str) -> str: ...
    @overload
    def str_(self, key: str, default: None = None) -> str | None: ...
    def str_(self, key: str, default: str | None = None) -> str | None:
        v = self.table.get(key, default)
        if v is not None and (not isinstance(v, str) or not v.strip()):
            raise self.fail(key, f"expected a non-empty string, got {v!r}")
        return v

    @overload
    def int_(self, key: str, default: int, lo: int, hi: int) -> int: ...
    @overload
    def int_(self, key: str, default: None, lo: int, hi: int) -> int | None: ...
    def int_(self, key: str, default: int | None, lo: int, hi: int) -> int | None:
        v = self.table.get(key, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise self.fail(key, f"expected a whole number from {lo} to {hi}, got {v!r}")
        return v

    def seconds(self, key: str, default: float) -> float:
        v = self.table.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 3600:
            raise self.fail(key, f"expected a number of seconds > 0 and at most 3600, got {v!r}")
        return float(v)

    def cost(self, key: str) -> float | None:
        v = self.table.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e9:
            raise self.fail(key, f"expected a cost per hour >= 0, got {v!r}")
        return float(v)

    def when(self, key: str) -> float | None:
        raw = self.table.get(key)
        if isinstance(raw, (dt.datetime, dt.date)):       # a TOML date or datetime, written without quotes
            return parse_when(raw.isoformat(), self._where(key))
        v = self.str_(key)
        return None if v is None else parse_when(v, self._where(key))

    def thresholds(self, key: str) -> Thresholds:
        v = self.table.get(key)
        if v is None:
            return Thresholds()
        if not isinstance(v, dict):
            raise self.fail(key, f"expected a table of alert thresholds, got {v!r}")
        return Thresholds.from_table(v, self._where(key))

    def strings(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        v = self.table.get(key)
        if v is None:
            return default
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) and x.strip() for x in v):
            raise self.fail(key, f"expected a string or a list of strings, got {v!r}")
        return tuple(v)


def _node(path: Path, text: str, name: str, table: Any) -> NodeConfig:
    c = _Checker(path, text, name, table if isinstance(table, dict) else {})
    if not _NAME.match(name):
        raise c.fail(None, "node names may hold only letters, digits, '.', '_' and '-'")
    if not isinstance(table, dict):
        raise c.fail(None, f"expected a table ([nodes.{name}]), got {table!r}")
    allowed = _LOCAL_KEYS if name == LOCAL else _SSH_KEYS
    for key in table:
        if key not in allowed:
            hint = " (the local node is this machine: it takes no ssh settings)" if key in _SSH_KEYS else ""
            raise c.fail(key, f"unknown key {key!r}{hint}; known keys: {', '.join(sorted(allowed))}")
    if name != LOCAL and "ssh" not in table:
        raise c.fail(None, 'missing key "ssh" (an ssh config alias or user@host)')
    root = c.str_("root", DEFAULT_ROOT)
    if not (root.startswith("/") or root == "~" or root.startswith("~/")):
        raise c.fail("root", f"expected an absolute path or one starting with ~/, got {root!r}")
    if name == LOCAL:
        root = str(Path(root).expanduser())
    urls = c.strings("metrics_url", ())
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise c.fail("metrics_url", f"expected an http:// or https:// URL, got {url!r}")
    return NodeConfig(
        name=name,
        ssh=c.str_("ssh"),
        port=c.int_("port", None, 1, 65535),
        root=root,
        ssh_config=c.str_("ssh_config"),
        watch_paths=c.strings("watch", ("/",)),
        max_parallel=c.int_("max_parallel", 4, 1, 1024),
        metrics_url=urls,
        connect_timeout=c.seconds("connect_timeout", 10.0),
        cost_per_hour=c.cost("cost_per_hour"),
        retire_after=c.when("retire_after"),
        on_alert=c.str_("on_alert"),
        alerts=c.thresholds("alerts"),
        rdzv_host=c.str_("rdzv_host"),
    )


def load_nodes(config_path: str | Path | None = None) -> Nodes:
    """Nodes from nodes.toml (given, or the XDG config one); `local` is always among them.

    A missing default file means just `local`; a missing file named explicitly is an error,
    and so is a file that is not TOML or not made of [nodes.NAME] sections (UserError, one line).
    A wrong node section only makes that node unusable: see `Nodes.errors` and `get_node`.
    """
    path = Path(config_path).expanduser() if config_path is not None else default_config_path()
    nodes = Nodes({LOCAL: NodeConfig(LOCAL, root=str(Path(DEFAULT_ROOT).expanduser()))})
    if not path.exists():
        if config_path is not None:
            raise UserError(f"{path}: no such nodes file")
        return nodes
    raw = read_input(path, "nodes file")
    text = utf8_text(raw, path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        msg = (str(e)[: m.start()].strip() if m else str(e)).replace("\n", " ")
        raise UserError(f"{path}:{m.group(1)}: {msg}" if m else f"{path}:1: {msg}") from None
    except ValueError as e:
        raise UserError(toml_value_error(text, path, e)) from None
    except RecursionError:
        data = None
    if data is None or too_deep(data):
        raise UserError(f"{path}:{deep_line(text)}: arrays or tables nested deeper than {MAX_DEPTH} levels")
    for key in data:
        if key != "nodes":
            rx = re.compile(r"""\s*(\[+\s*)?(["']?)%s\2\s*[\].=]""" % re.escape(key))
            line = next((i for i, text_line in enumerate(text.splitlines(), 1) if rx.match(text_line)), 1)
            raise UserError(f"{path}:{line}: unknown top-level key {key!r} (expected [nodes.NAME] sections)")
    table = data.get("nodes", {})
    if not isinstance(table, dict):
        raise UserError(f"{path}:{_line_of(text, None, 'nodes') or 1}: nodes: expected [nodes.NAME] sections")
    for name, node_table in table.items():
        try:
            nodes[name] = _node(path, text, name, node_table)
        except UserError as e:
            nodes.pop(name, None)
            nodes.errors[name] = str(e)
    return nodes


def get_node(nodes: dict[str, NodeConfig], name: str) -> NodeConfig:
    """The node called name, or a one-line UserError: its section's error, or the known nodes."""
    errors = getattr(nodes, "errors", {})
    if name in errors:
        raise UserError(errors[name])
    try:
        return nodes[name]
    except KeyError:
        raise UserError(f"unknown node {name!r} (known: {', '.join(sorted(nodes))})") from None


def open_host(node: NodeConfig, *, accept_new_host_key: bool = False, audit: AuditHook | None = None) -> Host:
    """A Host for node: LocalHost for `local`, SSHHost otherwise (connects on first use)."""
    if node.ssh is None:
        return LocalHost(node.name, audit=audit)
    from ops.hosts.ssh import SSHHost  # lazy: paramiko (0.25 s) loads only for a node reached over ssh

    return SSHHost(
        node.name,
        node.ssh,
        port=node.port,
        ssh_config=node.ssh_config,
        accept_new_host_key=accept_new_host_key,
        audit=audit,
        connect_timeout=node.connect_timeout,
    )

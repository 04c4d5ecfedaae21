"""The nodes nodedeck knows (nodes.toml) and opening a Host for one.

    [nodes.gpu1]
    ssh = "gpu1"                 # an ~/.ssh/config alias, or user@host[:port]
    root = "/data/work"          # pipeline work dir on the node
    max_parallel = 4

Each section's keys are declared once, below (`SshSection`, and `LocalSection` for `[nodes.local]`: this
machine, which always exists and takes no ssh settings), with what each does. A node whose section is wrong
is unusable (its errors, `FILE:LINE: nodes.NAME.KEY: ...`, every one of them, come when a command names it),
while the other nodes keep working.
"""

from __future__ import annotations

import datetime as dt
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias, Union

from pydantic import AfterValidator, BeforeValidator, Field

from ops import hints
from ops.alerts.records import Thresholds, parse_when
from ops.declared import Problem, Table, Text, brief, broken, listed, must, validate
from ops.errors import UserError
from ops.hosts.base import AuditHook, Host
from ops.hosts.local import LocalHost
from ops.inputfile import MAX_DEPTH, deep_line, read_input, toml_value_error, too_deep, utf8_text
from ops.paths import config_dir

LOCAL = "local"
DEFAULT_ROOT = "~/nodedeck-work"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


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
    """The usable nodes by name; `errors` holds, by name, every error of each node whose section is wrong (one line
    each, in line order)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.errors: dict[str, tuple[str, ...]] = {}


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


def _root(root: str) -> str:
    if not (root.startswith("/") or root == "~" or root.startswith("~/")):
        raise ValueError("not absolute")
    return root


def _urls(urls: list[str]) -> list[str]:
    bad = next((u for u in urls if not u.startswith(("http://", "https://"))), None)
    if bad is not None:
        raise broken("say", f"expected an http:// or https:// URL, got {bad!r}")
    return urls


def _outside(check: Any) -> Any:
    """A check that says its own `WHERE: message` (ops.alerts.records): its message, said at this key."""
    def run(value: Any) -> Any:
        try:
            return check(value)
        except UserError as e:
            raise broken("say", str(e).removeprefix("\0: ")) from None
    return AfterValidator(run)


Strings = Annotated[list[Annotated[str, Field(pattern=r"\S")]], BeforeValidator(listed),
                    must("a string or a list of strings")]

if TYPE_CHECKING:   # what validation makes of them (mypy knows no validators)
    When: TypeAlias = float
    Alerts: TypeAlias = Thresholds
else:
    When = Annotated[Union[str, dt.datetime, dt.date], must("a date and time like 2026-12-05T18:00"),
                     _outside(lambda v: parse_when(v if isinstance(v, str) else v.isoformat(), "\0"))]
    Alerts = Annotated[dict[str, Any], must("a table of alert thresholds"),
                       _outside(lambda v: Thresholds.from_table(v, "\0"))]


class LocalSection(Table):
    """[nodes.local]: this machine (no ssh settings)."""

    root: Annotated[Text, AfterValidator(_root), must("an absolute path or one starting with ~/")] = Field(
        DEFAULT_ROOT, description="pipeline work dir on the node")
    watch: Strings = Field(["/"], description="disk paths to watch")
    max_parallel: Annotated[int, Field(ge=1, le=1024), must("a whole number from 1 to 1024")] = Field(
        4, description="stage parallelism")
    metrics_url: Annotated[Strings, AfterValidator(_urls)] = Field([], description="inference servers' /metrics")
    cost_per_hour: Annotated[Union[Annotated[int, Field(ge=0, lt=10**9)], Annotated[float, Field(ge=0, lt=1e9)]],
                             must("a cost per hour >= 0")] | None = Field(
        None, description="for the fleet's spent and projected cost")
    retire_after: When | None = Field(None, description="when it will be shut down: alert while files are not "
                                                       "preserved")
    on_alert: Text | None = Field(None, description="run once per new alert (bash, here)")
    alerts: Alerts | None = Field(None, description="alert thresholds (ops.alerts.records.Thresholds)")
    rdzv_host: Text | None = Field(None, description="the address other nodes reach this one at, when it leads a "
                                                     "stage's `nodes` (default: the ssh HostName)")


class SshSection(LocalSection):
    """[nodes.NAME]: a node reached over ssh."""

    ssh: Text = Field(description="an ssh config alias or user@host")
    port: Annotated[int, Field(ge=1, le=65535), must("a whole number from 1 to 65535")] | None = Field(
        None, description="overrides the ssh config")
    ssh_config: Text | None = None
    connect_timeout: Annotated[Union[Annotated[int, Field(gt=0, le=3600)], Annotated[float, Field(gt=0, le=3600)]],
                               must("a number of seconds > 0 and at most 3600")] = 10.0


def _node(path: Path, text: str, name: str, table: Any) -> NodeConfig | list[tuple[int, str]]:
    """The node, or its section's every error as (line, message)."""
    def said(key: str | None, message: str) -> tuple[int, str]:
        line = _line_of(text, name, key) or next((n for n, t in enumerate(text.splitlines(), 1) if name in t), 1)
        where = f"{path}:{line}: nodes.{name}" + (f".{key}" if key else "")
        return line, f"{where}: {message}".replace("\n", "\\n").replace("\r", "\\r")

    if not _NAME.match(name):
        return [said(None, "node names may hold only letters, digits, '.', '_' and '-'")]
    if not isinstance(table, dict):
        return [said(None, f"expected a table ([nodes.{name}]), got {brief(table)}")]
    section = LocalSection if name == LOCAL else SshSection
    node, problems = validate(section, table)
    if not isinstance(node, LocalSection):
        return sorted(said(*_words(p, section)) for p in problems)
    return NodeConfig(name=name, ssh=getattr(node, "ssh", None), port=getattr(node, "port", None),
                      root=str(Path(node.root).expanduser()) if name == LOCAL else node.root,
                      ssh_config=getattr(node, "ssh_config", None), watch_paths=tuple(node.watch),
                      max_parallel=node.max_parallel, metrics_url=tuple(node.metrics_url),
                      connect_timeout=float(getattr(node, "connect_timeout", 10.0)),
                      cost_per_hour=None if node.cost_per_hour is None else float(node.cost_per_hour),
                      retire_after=node.retire_after, on_alert=node.on_alert, alerts=node.alerts or Thresholds(),
                      rdzv_host=node.rdzv_host)


def _words(p: Problem, section: type[LocalSection]) -> tuple[str | None, str]:
    """(the key, the message) of a problem in a node's section."""
    key = str(p.loc[0]) if p.loc else None
    if p.how == "unknown":
        hint = " (the local node is this machine: it takes no ssh settings)" if key in SshSection.model_fields \
            else ""
        return key, f"unknown key {key!r}{hint}; known keys: {', '.join(p.known)}"
    if p.how == "missing":
        return None, f'missing key "{key}" ({section.model_fields[str(key)].description})'
    if p.how == "must":
        return key, f"expected {p.text}, got {brief(p.got)}"
    return key, p.text


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
        node = _node(path, text, name, node_table)
        if isinstance(node, NodeConfig):
            nodes[name] = node
        else:
            nodes.pop(name, None)
            nodes.errors[name] = tuple(message for _line, message in node)
    return nodes


def get_node(nodes: dict[str, NodeConfig], name: str) -> NodeConfig:
    """The node called name, or a one-line UserError: its section's error, or the known nodes."""
    errors = getattr(nodes, "errors", {})
    if name in errors:
        first, *more = errors[name]
        raise UserError(first + (f" (and {len(more)} more in [nodes.{name}]: {hints.current().command('nodes')})"
                                 if more else ""))
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

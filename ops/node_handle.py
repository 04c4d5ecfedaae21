"""NodeHandle: one node's Host, StateStore and TmuxRunner, opened on first use, closed together;
NodeHandles: the one handle of each node a process works on (the plan engine, the dashboard, the fleet and
the CLI share it).

Every command sent to the host is recorded in the store's audit log. The runner's
run dir is `<node root>/.nodedeck/runs` on the node. Both are safe to share between threads.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ops.hosts.base import Host
from ops.nodes import NodeConfig, get_node, load_nodes, open_host
from ops.state import StateStore
from ops.tmux import TmuxRunner

RUN_SUBDIR = ".nodedeck/runs"


class NodeHandle:
    """What the plan engine, telemetry, TUI and CLI need of one node."""

    def __init__(self, node: NodeConfig, *, accept_new_host_key: bool = False, store: StateStore | None = None):
        self.node = node
        self.name = node.name
        self.max_parallel = node.max_parallel
        self.accept_new_host_key = accept_new_host_key
        self._lock = threading.RLock()
        self._store = store
        self._own_store = store is None
        self._host: Host | None = None
        self._root: str | None = None
        self._runner: TmuxRunner | None = None

    @classmethod
    def open(cls, name: str, config_path: str | Path | None = None, **kwargs) -> "NodeHandle":
        """The session of node `name` from nodes.toml (`config_path`, or the XDG one)."""
        return cls(get_node(load_nodes(config_path), name), **kwargs)

    @property
    def store(self) -> StateStore:
        with self._lock:
            if self._store is None:
                self._store = StateStore.for_node(self.name)
            return self._store

    @property
    def host(self) -> Host:
        """The node's Host (connects on its first command), auditing into the store."""
        with self._lock:
            if self._host is None:
                self._host = open_host(self.node, accept_new_host_key=self.accept_new_host_key,
                                       audit=self.store.record_audit)
            return self._host

    @property
    def root(self) -> str:
        """The node's work dir as an absolute path there (asks the node for $HOME when it starts with ~)."""
        with self._lock:
            if self._root is None:
                self._root = self.node.root_on(self.host).rstrip("/") or "/"
            return self._root

    @property
    def rdzv_host(self) -> str:
        """The address other nodes reach this one at (torchrun's rendezvous when it is the first node of a
        stage on several nodes): nodes.toml's `rdzv_host`, else the HostName ssh connects to, else 127.0.0.1."""
        if self.node.rdzv_host:
            return self.node.rdzv_host
        from ops.hosts.ssh import SSHHost  # lazy: paramiko (0.25 s) loads only for a node reached over ssh

        host = self.host
        return host.target.hostname if isinstance(host, SSHHost) else "127.0.0.1"

    @property
    def run_dir(self) -> str:
        return f"{self.root.rstrip('/')}/{RUN_SUBDIR}"

    @property
    def runner(self) -> TmuxRunner:
        with self._lock:
            if self._runner is None:
                self._runner = TmuxRunner(self.host, self.store, self.run_dir)
            return self._runner

    def resolve(self, path: str) -> str:
        """An absolute path on the node: relative ones are under the root, ~/ is the node user's home."""
        if path.startswith("/"):
            return path
        if path == "~" or path.startswith("~/"):
            return self.host.home().rstrip("/") + path[1:]
        return f"{self.root.rstrip('/')}/{path}"

    def close(self) -> None:
        with self._lock:
            if self._host is not None:
                self._host.close()
                self._host = None
            if self._store is not None and self._own_store:
                self._store.close()
                self._store = None
            self._runner = None

    def __enter__(self) -> "NodeHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NodeHandles:
    """Node name -> its one NodeHandle, opened on first use from nodes.toml (`config_path`, or the XDG one) or from
    the `configs` given; `close()` closes every handle it opened. A name it cannot open raises UserError."""

    def __init__(self, config_path: str | Path | None = None, *, configs: dict[str, NodeConfig] | None = None,
                 accept_new_host_key: bool = False):
        self.config_path = config_path
        self._configs = configs
        self._accept_new_host_key = accept_new_host_key
        self._handles: dict[str, NodeHandle] = {}
        self._opened: list[NodeHandle] = []
        """The handles it opened (not those `of` was given): close() closes these."""
        self._lock = threading.Lock()

    @classmethod
    def of(cls, *handles: NodeHandle) -> "NodeHandles":
        """These handles, opened elsewhere (whoever opened them closes them); any other node is unknown."""
        nodes = cls(configs={h.name: h.node for h in handles})
        nodes._handles.update((h.name, h) for h in handles)
        return nodes

    def __call__(self, name: str) -> NodeHandle:
        with self._lock:
            handle = self._handles.get(name)
            if handle is None:
                configs = self._configs if self._configs is not None else load_nodes(self.config_path)
                handle = self._handles[name] = NodeHandle(get_node(configs, name),
                                                          accept_new_host_key=self._accept_new_host_key)
                self._opened.append(handle)
            return handle

    def close(self, wait_s: float | None = None) -> None:
        """Close the handles it opened. With wait_s each closes in a thread of its own and this returns after at
        most wait_s: one still connecting to a dead node holds its lock until its connect timeout."""
        with self._lock:
            opened, self._opened = self._opened, []
            self._handles = {name: h for name, h in self._handles.items() if h not in opened}
        if wait_s is None:
            for handle in opened:
                handle.close()
            return
        closers = [threading.Thread(target=h.close, name=f"close {h.name}", daemon=True) for h in opened]
        for t in closers:
            t.start()
        deadline = time.monotonic() + wait_s
        for t in closers:
            t.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> "NodeHandles":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

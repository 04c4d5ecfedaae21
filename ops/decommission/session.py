"""Setting a decommission up for a configured node: its Host, OpenSSH options, root and plan."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from ops.decommission.transfer import openssh_argv
from ops.decommission.wizard import Decommission, Event, Options, StageStates
from ops.hosts.base import Host
from ops.nodes import NodeConfig, get_node, load_nodes, open_host


def decommission_for(
    host: Host,
    node: NodeConfig,
    options: Options,
    *,
    stage_states: StageStates | None = None,
    on_event: Callable[[Event], None] | None = None,
    cancel=None,
) -> Decommission:
    """A Decommission of `node` through an open `host` (LocalHost or SSHHost)."""
    target = getattr(host, "target", None)
    ssh_argv = openssh_argv(target, node.ssh_config) if host.kind == "ssh" and target is not None else None
    return Decommission(host, node.name, node.root, options, ssh_argv=ssh_argv, stage_states=stage_states,
                        on_event=on_event, cancel=cancel)


@contextmanager
def open_decommission(
    node_name: str,
    options: Options,
    *,
    config: str | None = None,
    on_event: Callable[[Event], None] | None = None,
) -> Iterator[Decommission]:
    """Load the node from nodes.toml, connect, and yield its Decommission; the host is closed after."""
    node = get_node(load_nodes(config), node_name)
    host = open_host(node)
    try:
        yield decommission_for(host, node, options, on_event=on_event)
    finally:
        host.close()

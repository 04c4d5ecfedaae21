"""Setting a decommission up for a node: its Host, OpenSSH options, root, plan paths and stage states."""

from __future__ import annotations

import dataclasses
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ops.decommission.events import OnEvent
from ops.decommission.inputs import Options, StageStates
from ops.decommission.own_env import own_paths
from ops.decommission.transfer import openssh_argv
from ops.decommission.wizard import Decommission
from ops.hosts.base import Host
from ops.node_handle import NodeHandle
from ops.nodes import NodeConfig
from ops.plan.records import Plan
from ops.plan.resolve import Resolver
from ops.setup import record as setup_record


def plan_paths(plan: Plan, handle: NodeHandle) -> list[str]:
    """The plan's root (when it names one) and the outputs of its stages that run on this node."""
    out: list[str] = []
    for stage in plan.stages:
        if (stage.node or plan.node or handle.name) != handle.name:
            continue
        r = Resolver(plan, stage, node_name=handle.name, node_root=handle.root, run_dir=handle.run_dir)
        if plan.root and r.values["root"] not in out:
            out.append(r.values["root"])
        out += [o for o in r.stage(stage).outputs if o not in out]
    return out


def stage_states(plan: Plan, handle: NodeHandle) -> StageStates:
    """What the plan engine last recorded for each stage of the plan on this node."""
    rows = handle.store.get_stage_states(plan.name)
    ordered = [rows[s.id] for s in plan.stages if s.id in rows]
    return StageStates(
        plan.name,
        tuple(ordered),
        "" if ordered else f"plan {plan.name!r} has no stage states recorded for node {handle.name}",
    )


def decommission_on(
    host: Host,
    node: NodeConfig,
    options: Options,
    *,
    root: str | None = None,
    stage_states: StageStates | None = None,
    on_event: OnEvent | None = None,
    cancel: threading.Event | None = None,
) -> Decommission:
    """A Decommission of `node` through an open `host`; OpenSSH streams reach the same node as SSHHost.
    nodedeck's own environment is where `node setup` puts it by default, unless `options` say where."""
    from ops.hosts.ssh import SSHHost  # lazy: paramiko (0.25 s) loads only for a node reached over ssh

    if not options.own_env:
        options = dataclasses.replace(options, own_env=own_paths(root or node.root, None))

    ssh_argv = openssh_argv(host.target, node.connect_timeout) if isinstance(host, SSHHost) else None
    return Decommission(host, node.name, root or node.root, options, ssh_argv=ssh_argv, stage_states=stage_states,
                        on_event=on_event, cancel=cancel)


def decommission_for(
    handle: NodeHandle,
    options: Options,
    *,
    plan: Plan | None = None,
    on_event: OnEvent | None = None,
    cancel: threading.Event | None = None,
) -> Decommission:
    """A Decommission of the handle's node (commands audited into its store); a plan adds its paths and states,
    and the node's recorded setup says where nodedeck's own environment is."""
    options = dataclasses.replace(options, own_env=own_paths(handle.root, setup_record.load(handle.store)))
    states = None
    if plan is not None:
        options = dataclasses.replace(options, plan_paths=[*options.plan_paths, *plan_paths(plan, handle)])
        states = stage_states(plan, handle)
    return decommission_on(handle.host, handle.node, options, root=handle.root, stage_states=states,
                           on_event=on_event, cancel=cancel)


@contextmanager
def open_decommission(
    node_name: str,
    options: Options,
    *,
    config: str | Path | None = None,
    plan: Plan | None = None,
    on_event: OnEvent | None = None,
) -> Iterator[Decommission]:
    """The node from nodes.toml, connected, as a Decommission; the handle is closed after."""
    with NodeHandle.open(node_name, config) as handle:
        yield decommission_for(handle, options, plan=plan, on_event=on_event)

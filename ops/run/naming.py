"""What a plan's runs are called on a node: the stage column of its runs and their tmux sessions."""

from __future__ import annotations

import hashlib

from ops.node_handle import NodeHandle
from ops.plan.resolve import session_name


def run_key(plan_name: str, stage_id: str) -> str:
    """The `stage` of a stage's runs in the node's store: unique across plans on a node."""
    return f"{plan_name}/{stage_id}"


def workspace_tag(handle: NodeHandle) -> str:
    """A short hash of a node's name and work dir: two work dirs never share a tmux session."""
    return hashlib.sha1(f"{handle.name}\0{handle.root}".encode()).hexdigest()[:6]


def new_tmux_session(plan_name: str, stage_id: str, workspace: str) -> str:
    """The tmux session (TmuxRunner adds `nd-`) a new run of a stage gets in a workspace."""
    return f"{session_name(plan_name, stage_id)[:56]}-{workspace}"

"""The command that attaches a terminal to a stage's tmux session on its node (`nodedeck stage attach`).

Locally: `tmux attach-session -t =NAME` with the runner's environment (its TMUX_TMPDIR names the socket
the runner's sessions live on; $TMUX is dropped so attaching from inside another tmux works).
Remotely: `ssh -t [-F CONFIG] [-p PORT] TARGET tmux attach-session -t =NAME`, through the node's ssh
alias and ssh_config, as OpenSSH reads them. Detaching (C-b d) returns to the caller.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

from ops.hosts.ssh_tokens import expand_tilde
from ops.nodes import NodeConfig


@dataclass(frozen=True)
class AttachCommand:
    """argv to run in the user's terminal, with the environment to run it in."""

    node: str
    tmux_session: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def to_json(self) -> dict:
        return {"node": self.node, "tmux_session": self.tmux_session, "argv": list(self.argv)}


def split_target(target: str) -> tuple[str, int | None]:
    """`user@host:2222` -> (`user@host`, 2222); an alias or user@host stays whole."""
    host, sep, port = target.rpartition(":")
    if sep and port.isdigit() and host and ":" not in host:
        return host, int(port)
    return target, None


def attach_command(node: NodeConfig, tmux_session: str, environ: dict[str, str] | None = None) -> AttachCommand:
    """How to attach to tmux session `tmux_session` (the full `nd-...` name) on node."""
    env = dict(os.environ if environ is None else environ)
    tmux = ("tmux", "attach-session", "-t", f"={tmux_session}")
    if node.ssh is None:
        env.pop("TMUX", None)
        env.pop("TMUX_PANE", None)
        return AttachCommand(node.name, tmux_session, tmux, env)
    target, port = split_target(node.ssh)
    port = node.port or port
    argv = ["ssh", "-t"]
    if node.ssh_config:
        argv += ["-F", expand_tilde(node.ssh_config)]
    if port:
        argv += ["-p", str(port)]
    argv += [target, shlex.join(tmux)]
    return AttachCommand(node.name, tmux_session, tuple(argv), env)

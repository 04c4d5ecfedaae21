"""The command that attaches a terminal to a stage's tmux session on its node (`nodedeck stage attach`).

Stages live in nodedeck's own tmux server on each node (`tmux -L nodedeck`, ops.tmux.sessions.SERVER; a run an
older nodedeck launched may be in the node's default server, LEGACY_SERVER). Locally: `tmux -L SERVER
attach-session -t =NAME` with the runner's environment (its TMUX_TMPDIR names the socket dir; $TMUX is
dropped). Remotely: `ssh -t [-F CONFIG] [-p PORT] TARGET tmux -L SERVER attach-session -t =NAME`, through the
node's ssh alias and ssh_config, as OpenSSH reads them. Detaching (C-b d) returns to the caller.

From inside tmux ($TMUX set: the dashboard or the CLI runs in a tmux pane) a plain attach would nest; there
`inside_tmux` gives `tmux switch-client -t =NAME` when the session is on the caller's own server, else
`tmux new-window -n NAME 'ATTACH'`: the session opens in a new window of the caller's tmux. A tmux window gets
the tmux server's environment, not the caller's: the ssh-agent the node's connection uses (the caller's
$SSH_AUTH_SOCK, or the variable the node's IdentityAgent names) goes with it (`new-window -e`), or the
window's ssh would ask for the key's passphrase.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass, field, replace

from ops.errors import NodedeckError
from ops.hosts.ssh_target import expand_tilde, resolve
from ops.nodes import NodeConfig
from ops.stderr_tail import TAIL_BYTES
from ops.textsafe import last_line
from ops.tmux.sessions import SERVER


@dataclass(frozen=True)
class AttachCommand:
    """argv to run in the user's terminal, with the environment to run it in."""

    node: str
    tmux_name: str  # the tmux session's full name, nd-...
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    socket: str | None = None
    """The local tmux server's socket path (None on a remote node): a caller inside that server switches."""
    how: str = "attach"
    """attach (takes the terminal until detached) | switch-client | new-window (return at once)."""
    carry: tuple[tuple[str, str], ...] = ()
    """Variables of the caller's environment its ssh needs (the agent's socket): a new tmux window gets them."""

    def to_json(self) -> dict:
        return {"node": self.node, "tmux_session": self.tmux_name, "argv": list(self.argv), "how": self.how}


def split_target(target: str) -> tuple[str, int | None]:
    """`user@host:2222` -> (`user@host`, 2222); an alias or user@host stays whole."""
    host, sep, port = target.rpartition(":")
    if sep and port.isdigit() and host and ":" not in host:
        return host, int(port)
    return target, None


def socket_path(server: str, environ: dict[str, str]) -> str:
    """Where tmux puts server `server`'s socket on this machine ($TMUX_TMPDIR or /tmp, tmux-UID/NAME)."""
    return os.path.join(environ.get("TMUX_TMPDIR") or "/tmp", f"tmux-{os.getuid()}", server)


def attach_command(node: NodeConfig, tmux_name: str, environ: dict[str, str] | None = None,
                   server: str = SERVER) -> AttachCommand:
    """How to attach to the tmux session named `tmux_name` (the full `nd-...` name) of tmux server `server` on node."""
    env = dict(os.environ if environ is None else environ)
    tmux = ("tmux", "-L", server, "attach-session", "-t", f"={tmux_name}")
    if node.ssh is None:
        env.pop("TMUX", None)
        env.pop("TMUX_PANE", None)
        return AttachCommand(node.name, tmux_name, tmux, env, socket_path(server, env))
    target, port = split_target(node.ssh)
    port = node.port or port
    argv = ["ssh", "-t"]
    if node.ssh_config:
        argv += ["-F", expand_tilde(node.ssh_config)]
    if port:
        argv += ["-p", str(port)]
    argv += [target, shlex.join(tmux)]
    return AttachCommand(node.name, tmux_name, tuple(argv), env, carry=_agent_env(node, env))


def _agent_env(node: NodeConfig, env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The variable that names the ssh-agent ssh uses for node (IdentityAgent `$VAR`, else SSH_AUTH_SOCK), with
    its value here; none when IdentityAgent is a path or `none` (ssh reads those from its config)."""
    assert node.ssh is not None
    try:
        agent = resolve(node.ssh, node.ssh_config, port=node.port).identity_agent
    except NodedeckError:   # (a config the connection could not have used either: the default agent)
        agent = None
    if agent is None or agent == "SSH_AUTH_SOCK":
        name = "SSH_AUTH_SOCK"
    elif agent.startswith("$"):
        name = agent[1:]
    else:
        return ()
    return ((name, env[name]),) if env.get(name) else ()


def inside_tmux(cmd: AttachCommand, environ: dict[str, str] | None = None) -> AttachCommand | None:
    """The caller runs in a tmux pane ($TMUX): show the session there without nesting (see the module's doc).
    None outside tmux (run `cmd` itself)."""
    env = dict(os.environ if environ is None else environ)
    outer = env.get("TMUX", "").split(",")[0]
    if not outer:
        return None
    if cmd.socket is not None and os.path.realpath(cmd.socket) == os.path.realpath(outer):
        argv: tuple[str, ...] = ("tmux", "switch-client", "-t", f"={cmd.tmux_name}")
        return replace(cmd, argv=argv, env=env, how="switch-client")
    inner = cmd.argv if cmd.socket is None else ("tmux", "-S", cmd.socket, *cmd.argv[3:])   # the new window
    carried = [w for name, value in cmd.carry for w in ("-e", f"{name}={value}")]   # has the outer server's env
    argv = ("tmux", "new-window", *carried, "-n", cmd.tmux_name, shlex.join(inner))
    return replace(cmd, argv=argv, env=env, how="new-window")


def run_attach(cmd: AttachCommand) -> tuple[int, str]:
    """Run it in this terminal; (exit status, the last line tmux or ssh wrote to stderr, for a failure: as
    ops.textsafe.last_line, and only the last TAIL_BYTES of that stream are ever kept)."""
    tail = b""
    with subprocess.Popen(list(cmd.argv), env=cmd.env, stderr=subprocess.PIPE) as p:
        stderr = p.stderr
        assert stderr is not None
        while chunk := os.read(stderr.fileno(), 1 << 16):
            tail = (tail + chunk)[-TAIL_BYTES:]
    return p.returncode, last_line(tail)

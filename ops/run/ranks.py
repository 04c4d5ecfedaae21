"""A job on several nodes: the torchrun line each node runs, and how its ranks add up to one stage.

A stage with `nodes = ["gpu1", "gpu2"]` runs its command on every node, each under

    torchrun --nnodes 2 --node-rank R --nproc-per-node P --master-addr HOST --master-port PORT \
        --no-python bash -c COMMAND

torchrun's static rendezvous: node-rank R holds global ranks R*P to R*P+P-1, so the first node holds
rank 0, which writes the results (nodedeck-train writes only on rank 0: its nodes need not share a
disk). The stage's record, log, progress and verify checks are therefore the first node's. HOST is the
first node's address as the others reach it (the stage's `rdzv_host`, else the node's `rdzv_host` in
nodes.toml, else the HostName ssh connects to, 127.0.0.1 for `local`: ops.node_handle); PORT is a
port free on the first node when the stage launches. torchrun must be on every node's PATH.

Each node-rank is a run of its own, in its node's tmux and state. The stage is running while any of
them runs, failed as soon as one ended badly (the others are then stopped by their recorded PIDs),
and completed once every one exited 0 and the checks pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from ops import nodenum
from ops.errors import HostError
from ops.hosts.base import Host, join_argv
from ops.run.views import RankView
from ops.state import RunRecord

FREE_PORT_SCRIPT = "python3 -c 'import socket; s = socket.socket(); s.bind((\"\", 0)); print(s.getsockname()[1])'"


@dataclass(frozen=True)
class Rendezvous:
    """Where the node-ranks of one launch meet: the first node's address and a port free there."""

    host: str
    port: int
    nnodes: int
    nproc_per_node: str


def torchrun_command(command: str, rdzv: Rendezvous, node_rank: int) -> str:
    """The shell line that runs `command` (a bash line) as the workers of node-rank `node_rank`.

    torchrun passes its program's arguments through string.Template (for `${local_rank}`), which
    turns `$$` into `$`: every `$` is doubled so the command reaches bash as written."""
    return join_argv(["torchrun", "--nnodes", str(rdzv.nnodes), "--node-rank", str(node_rank),
                      "--nproc-per-node", rdzv.nproc_per_node, "--master-addr", rdzv.host,
                      "--master-port", str(rdzv.port), "--no-python", "bash", "-c", command.replace("$", "$$")])


def free_port(host: Host) -> int:
    """A TCP port free on host now (the kernel's pick, made by the node's python3)."""
    out = host.run_script(FREE_PORT_SCRIPT, timeout=30).check().text.split()
    port = nodenum.PORT.get(out[0]) if len(out) == 1 else None
    if port is None:
        raise HostError(f"{host.name}: could not pick a free port for torchrun (python3 said "
                        f"{nodenum.describe(' '.join(out))})")
    return port


@dataclass(frozen=True)
class Rank:
    """One node-rank of a launch as looked at now: its node and its run as recorded."""

    node_rank: int
    node_name: str
    run: RunRecord
    log_offset: int = 0             # where this launch began in its log

    @property
    def bad(self) -> bool:
        """It ended, and not with exit 0 on its own (an exit status, lost, stopped, never launched)."""
        r = self.run
        return not r.active and (r.state != "exited" or r.exit_code != 0 or r.stopped_at is not None)

    def view(self) -> RankView:
        r = self.run
        return RankView(self.node_rank, self.node_name, r.state, r.pid, r.exit_code, r.stopped_at is not None)


def first_bad(ranks: list[Rank]) -> Rank | None:
    """The node-rank that ended badly first (the cause: the others usually fail because it did)."""
    bad = [r for r in ranks if r.bad]
    return min(bad, key=lambda r: (r.run.ended_at or float("inf"), r.node_rank)) if bad else None

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
and completed once every one exited 0 and the checks pass. `RankRuns` looks at a launch's node-ranks,
says why one ended badly and stops them all at once.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from ops import nodenum
from ops.errors import HostError, NodedeckError
from ops.hosts.base import Host, join_argv
from ops.node_handle import NodeHandle
from ops.plan.records import Stage
from ops.run.context import PlanContext
from ops.run.record import Launch
from ops.run.tick import Tick, forget_statuses, status_on
from ops.run.views import RankView, StageState, StageView
from ops.state import RunRecord
from ops.textsafe import shown
from ops.units import HOURS, human_bytes, human_duration

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


def log_line(handle: NodeHandle, path: str, start: int) -> str:
    """The last line of a log on a node written after offset `start`, at most 200 characters, shown safely
    (ops.textsafe: it is the node's text)."""
    try:
        st = handle.host.stat(path)
        if st is None or st.size <= start:
            return ""
        tail = handle.host.read_range(path, max(start, st.size - 4096), 4096)
    except NodedeckError:
        return ""
    lines = [ln.strip() for ln in tail.decode(errors="replace").replace("\r", "\n").splitlines() if ln.strip()]
    return shown(lines[-1][:200]) if lines else ""


class RankRuns:
    """The node-ranks of a plan's stages on several nodes."""

    def __init__(self, ctx: PlanContext):
        self.ctx = ctx

    def ranks(self, launch: Launch, t: Tick | None) -> list[Rank]:
        """Every node-rank of a launch with its run as recorded after looking at it now (with a tick: one
        round trip per node, shared with the tick's other stages)."""
        out = []
        for i, rank_run in enumerate(launch.ranks):
            handle = self.ctx.handle_named(rank_run.node_name)
            try:
                run = handle.store.get_run(rank_run.run)
                if run.active:
                    if t is None:
                        handle.runner.status(run.tmux_session)
                    else:
                        status_on(handle, run, t)
                    run = handle.store.get_run(rank_run.run)   # the runner recorded how it ended
            except KeyError:
                raise NodedeckError(f"node-rank {i} on {rank_run.node_name}: run {rank_run.run} is not in that "
                                    "node's state") from None
            out.append(Rank(i, rank_run.node_name, run, rank_run.log_offset))
        return out

    def running_view(self, stage: Stage, run: RunRecord, base: StageView) -> StageView:
        """The view of a run whose node-ranks all go on (its log is node-rank 0's)."""
        up = human_duration(time.time() - run.started_at, HOURS)
        st = self.ctx.handle(stage).host.stat(run.log_path)
        if st is None:
            return replace(base, state=StageState.PENDING, detail=f"launched on {len(base.ranks)} nodes; no log yet")
        return replace(base, state=StageState.RUNNING,
                       detail=f"{len(base.ranks)} nodes, up {up}, log {human_bytes(st.size)} (node-rank 0's)")

    def detail(self, rank: Rank) -> str:
        """`node-rank 1 on gpu2: exit 1: <its last log line>` (or stopped, lost, could not launch)."""
        r = rank.run
        if r.state == "failed":
            why = "could not launch (see events)"
        elif r.state == "lost":
            why = "lost: process gone without an exit status"
        elif r.stopped_at is not None:
            why = "stopped"
        else:
            last = log_line(self.ctx.handle_named(rank.node_name), r.log_path, rank.log_offset)
            why = f"exit {r.exit_code}" + (f": {last}" if last else "")
        return f"node-rank {rank.node_rank} on {rank.node_name}: {why}"

    def stop(self, ranks: list[Rank], grace: float, t: Tick | None = None) -> list[str]:
        """Stop every given node-rank by its recorded PID, all at once (a rank left alone waits on its
        peers until its collective times out); one message each. A tick's cached statuses are dropped."""
        def stop_one(rank: Rank) -> str:
            handle = self.ctx.handle_named(rank.node_name)
            try:
                stopped = handle.runner.stop(rank.run.tmux_session, grace=grace)
                return f"{rank.node_name} r{rank.node_rank}: {stopped.message}"
            except NodedeckError as e:
                return f"{rank.node_name} r{rank.node_rank}: not stopped: {e}"

        with ThreadPoolExecutor(max_workers=max(len(ranks), 1)) as pool:
            messages = list(pool.map(stop_one, ranks))
        if t is not None:
            for rank in ranks:
                forget_statuses(t, rank.node_name, rank.run.tmux_session)
        return messages

"""The runs of a stage on several nodes (ops.run.ranks): each node-rank's run looked at now, why one
ended badly, and stopping them all at once."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from ops.errors import NodedeckError
from ops.node_handle import NodeHandle
from ops.plan.records import Stage
from ops.run.context import PlanContext
from ops.run.ranks import Rank
from ops.run.record import Launch
from ops.run.tick import Tick, forget_statuses, status_on
from ops.run.views import StageState, StageView
from ops.state import RunRecord
from ops.textsafe import shown
from ops.units import HOURS, human_bytes, human_duration


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

"""What the dashboard and the CLI read about a plan's stages, from the nodes' stores alone (no tick
needed first): logs, the server log of a node, and where metrics are."""

from __future__ import annotations

from ops.plan.records import StageKind
from ops.run.context import PlanContext
from ops.run.outputs import metrics_path
from ops.run.runmetrics import EarlierRun, metrics_of


class StageReads:
    """Reads about the stages of one plan."""

    def __init__(self, ctx: PlanContext):
        self.ctx = ctx

    def log_path(self, stage_id: str, node_rank: int = 0) -> str:
        """The log of the stage's latest run (where its next one goes when it never ran); with node_rank,
        that node-rank's, on its own node (`rank_tmux_session`)."""
        if node_rank:
            handle, tmux_session = self.ctx.rank_tmux_session(stage_id, node_rank)
            run = handle.store.latest_tmux_session_run(tmux_session)
            return run.log_path if run is not None and run.log_path else handle.runner.log_path(tmux_session)
        stage = self.ctx.plan.stage(stage_id)
        run = self.ctx.latest_run(stage)
        if run is not None and run.log_path:
            return run.log_path
        return self.ctx.resolved(stage).log or ""

    def logs(self, stage_id: str, lines: int = 200) -> str:
        """The last lines of the log of the stage's latest run."""
        stage = self.ctx.plan.stage(stage_id)
        return self.ctx.handle(stage).runner.tail(self.ctx.tmux_session(stage), lines)

    def server_log(self, node_name: str) -> str | None:
        """The log of a server stage's run that is active on node (as last recorded), if any."""
        for stage in self.ctx.plan.stages:
            if stage.kind is StageKind.SERVER and self.ctx.node_name(stage) == node_name:
                run = self.ctx.latest_run(stage)
                if run is not None and run.active:
                    return run.log_path
        return None

    def metrics_output(self, stage_id: str, smoke: bool) -> str | None:
        """A `*metrics*.jsonl` the stage's variant writes: among its outputs or the paths it verifies."""
        return metrics_path(self.ctx.resolved(self.ctx.plan.stage(stage_id)), smoke)

    def previous_metrics(self, stage_id: str) -> EarlierRun | None:
        """The stage's run before its latest one that wrote metrics, with the file holding them now
        (its archived copy once its variant ran again); None when there is none."""
        stage = self.ctx.plan.stage(stage_id)
        runs = self.ctx.handle(stage).store.runs_for_stage(self.ctx.run_key(stage))
        for i in range(len(runs) - 2, -1, -1):
            path = self.metrics_output(stage_id, runs[i].smoke)
            if path is not None:
                return EarlierRun(runs[i], i + 1, metrics_of(path, runs[i], runs))
        return None

    def training_metrics(self, node_name: str) -> tuple[str | None, list[str]]:
        """The metrics JSONL of the latest started training stage on node, and (when none started) the
        training stages there that have not started yet. Read from the recorded runs, not from a tick."""
        best: tuple[float, str] | None = None
        waiting = []
        for stage in self.ctx.plan.stages:
            if self.ctx.node_name(stage) != node_name:
                continue
            run = self.ctx.latest_run(stage)
            if run is None:
                if self.metrics_output(stage.id, False) is not None:
                    waiting.append(stage.id)
                continue
            path = self.metrics_output(stage.id, run.smoke)
            if path is not None and (best is None or run.started_at > best[0]):
                best = (run.started_at, path)
        return (best[1] if best else None), ([] if best else waiting)

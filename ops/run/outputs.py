"""Where a stage's results are: the metrics file its runs write (the training panel, the fleet, the archive
of earlier runs in ops.run.runmetrics)."""

from __future__ import annotations

from ops.plan.records import Stage


def metrics_path(resolved: Stage, smoke: bool) -> str | None:
    """A `*metrics*.jsonl` the stage's variant writes (the stage resolved for its node): the first among
    its outputs (a full run's) and the paths its checks verify."""
    checks = resolved.smoke.verify if smoke and resolved.smoke else resolved.verify
    paths = [*(() if smoke else resolved.outputs), *(c.args.get("path") for c in checks)]
    found = [p for p in paths if isinstance(p, str) and p.endswith(".jsonl") and "metrics" in p.rsplit("/", 1)[-1]]
    return found[0] if found else None

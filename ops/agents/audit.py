"""Hold a coding agent's todo claims against what the node shows.

Each item gets one claim verdict:
- verified      claimed completed; its linked stage is completed and its checks pass now
- unbacked      claimed completed, but no stage is linked or the linked stage has no checks
- contradicted  claimed completed or in progress, but the linked stage failed, is not running,
                or its checks fail now (the reason quotes the failing check)
- agrees        pending / in progress / cancelled, consistent with the linked stage
- unlinked      not claimed completed and no stage linked (a suggestion may be shown)
and, separately, `smoke_missing`: the item's stage has a smoke variant that never verified
while the item (the full-size run) is in progress or claimed completed.

CLI: `nodedeck todo audit --plan FILE --agent opencode[:SESSION] [--json]` (exit 1 when a claim is
contradicted or a smoke run is missing).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from ops.agents.links import StageLink, Suggestion, link_for, suggest
from ops.agents.todos import AgentItem
from ops.plan.parse import effective_verify
from ops.plan.records import Stage
from ops.run.views import StageState, StageView


class Claim(str, enum.Enum):
    VERIFIED = "verified"
    UNBACKED = "unbacked"
    CONTRADICTED = "contradicted"
    AGREES = "agrees"
    UNLINKED = "unlinked"


@dataclass(frozen=True)
class ItemAudit:
    item: AgentItem
    claim: Claim
    reason: str                        # one line: the evidence
    link: StageLink | None = None
    smoke_missing: bool = False
    suggestion: Suggestion | None = None

    @property
    def problem(self) -> bool:
        return self.claim is Claim.CONTRADICTED or self.smoke_missing

    def to_json(self) -> dict:
        return {**self.item.to_json(), "claim": self.claim.value, "reason": self.reason,
                "stage": self.link.stage_id if self.link else None, "linked_by": self.link.how if self.link else None,
                "smoke_missing": self.smoke_missing,
                "suggested_stage": self.suggestion.stage_id if self.suggestion else None}


@dataclass(frozen=True)
class AuditReport:
    items: tuple[ItemAudit, ...]

    def count(self, claim: Claim) -> int:
        return sum(1 for a in self.items if a.claim is claim)

    @property
    def ok(self) -> bool:
        return not any(a.problem for a in self.items)

    def summary(self) -> str:
        parts = [f"{self.count(c)} {c.value}" for c in Claim if self.count(c)]
        smoke = sum(1 for a in self.items if a.smoke_missing)
        if smoke:
            parts.append(f"{smoke} without a verified smoke run")
        return ", ".join(parts) or "no items"

    def to_json(self) -> dict:
        return {"ok": self.ok, "counts": {c.value: self.count(c) for c in Claim},
                "smoke_missing": sum(1 for a in self.items if a.smoke_missing),
                "items": [a.to_json() for a in self.items]}


_NEVER_RAN = {StageState.READY: "ready to start", StageState.PENDING: "pending", StageState.BLOCKED: "blocked"}


def _stands(view: StageView, stage: Stage, *, detail: bool = True) -> str:
    """`stage X is failed: exit 3`, or `stage X never ran (pending: waiting for prep)` for a stage with no run."""
    why = f": {view.detail}" if detail and view.detail and view.detail != view.state.value else ""
    if view.started_at is None and view.state in _NEVER_RAN:
        return f"stage {stage.id} never ran ({_NEVER_RAN[view.state]}{why})"
    return f"stage {stage.id} is {view.state.value}{why}"


def _failing(view: StageView) -> str | None:
    bad = [c.text for c in view.checks if not c.ok]
    return bad[0] if bad else None


def _completed_claim(view: StageView, stage: Stage) -> tuple[Claim, str]:
    if not effective_verify(stage, False):
        return Claim.UNBACKED, f"stage {stage.id} has no verify checks: nothing on the node backs the claim"
    if view.state is StageState.COMPLETED:
        failing = _failing(view)
        if failing:
            return Claim.CONTRADICTED, f"stage {stage.id}: check fails now: {failing}"
        return Claim.VERIFIED, f"stage {stage.id} completed, {len(view.checks)} checks pass"
    if view.state is StageState.SKIPPED:
        return Claim.UNBACKED, f"stage {stage.id} was skipped, not run"
    failing = _failing(view)
    if failing and view.state is StageState.FAILED:
        return Claim.CONTRADICTED, f"stage {stage.id} is failed: check fails: {failing}"
    return Claim.CONTRADICTED, _stands(view, stage)


def _progress_claim(view: StageView, stage: Stage) -> tuple[Claim, str]:
    if view.state.active:
        return Claim.AGREES, f"stage {stage.id} is {view.state.value}"
    if view.state is StageState.COMPLETED:
        return Claim.AGREES, f"stage {stage.id} already completed (the agent has not ticked it yet)"
    return Claim.CONTRADICTED, f"claimed in progress, but {_stands(view, stage)}"


def audit_item(item: AgentItem, stages: Sequence[Stage], views: Mapping[str, StageView],
               links: Mapping[str, str], recheck: Callable[[str], StageView] | None = None) -> ItemAudit:
    link = link_for(item, stages, dict(links))
    if link is None:
        hint = suggest(item, stages)
        if item.status == "completed":
            return ItemAudit(item, Claim.UNBACKED, "claimed completed, but no plan stage is linked to it",
                             suggestion=hint)
        return ItemAudit(item, Claim.UNLINKED, "no plan stage linked", suggestion=hint)
    stage = next(s for s in stages if s.id == link.stage_id)
    view = views[stage.id]
    if item.status == "completed" and recheck is not None and view.state is StageState.COMPLETED:
        view = recheck(stage.id)
    if item.status == "completed":
        claim, reason = _completed_claim(view, stage)
    elif item.status == "in_progress":
        claim, reason = _progress_claim(view, stage)
    else:                              # pending, cancelled, or a word of the agent's own (`blocked`): no claim
        claim, reason = Claim.AGREES, f"{item.status}; {_stands(view, stage, detail=False)}"
    smoke_running = view.smoke and view.state.active
    smoke_missing = (view.has_smoke and not view.smoke_verified and not smoke_running
                     and item.status in ("in_progress", "completed"))
    if smoke_missing:
        reason += f"; the smoke run of {stage.id} never verified"
    return ItemAudit(item, claim, reason, link, smoke_missing)


def audit(items: Sequence[AgentItem], stages: Sequence[Stage], views: Mapping[str, StageView],
          links: Mapping[str, str], recheck: Callable[[str], StageView] | None = None) -> AuditReport:
    """Every item's claim verdict. `recheck(stage_id)` re-runs a completed stage's checks now (the CLI
    passes the scheduler's verify); without it the stage's last check results are used."""
    return AuditReport(tuple(audit_item(i, stages, views, links, recheck) for i in items))

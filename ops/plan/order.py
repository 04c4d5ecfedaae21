"""The order stages are listed in: dependencies first (topological), priority breaking ties, then plan order."""

from __future__ import annotations

import heapq
from typing import Sequence

from ops.plan.model import Priority, StageView

PRIORITY_RANK = {Priority.HIGH: 0, Priority.MEDIUM: 1, Priority.LOW: 2}


def dependency_order(views: Sequence[StageView]) -> list[StageView]:
    """views with every stage after the stages it depends on; among stages whose dependencies are
    all listed, the higher priority first, then the plan's order. Dependencies outside `views` are
    ignored; a cycle (refused by the plan's lint) keeps its stages in plan order at the end."""
    index = {v.id: i for i, v in enumerate(views)}
    waiting = {v.id: {d for d in v.depends_on if d in index and d != v.id} for v in views}
    dependents: dict[str, list[str]] = {v.id: [] for v in views}
    for sid, deps in waiting.items():
        for d in deps:
            dependents[d].append(sid)

    def key(sid: str) -> tuple[int, int, str]:
        return PRIORITY_RANK.get(views[index[sid]].priority, 1), index[sid], sid

    ready = [key(sid) for sid, deps in waiting.items() if not deps]
    heapq.heapify(ready)
    out: list[StageView] = []
    while ready:
        *_, sid = heapq.heappop(ready)
        out.append(views[index[sid]])
        for nxt in dependents[sid]:
            waiting[nxt].discard(sid)
            if not waiting[nxt]:
                heapq.heappush(ready, key(nxt))
    placed = {v.id for v in out}
    return out + [v for v in views if v.id not in placed]

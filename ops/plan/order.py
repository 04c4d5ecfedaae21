"""The one dependency ordering of stages (topological), used by the parser, the scheduler and the todo list."""

from __future__ import annotations

import heapq
from typing import Callable, Protocol, Sequence, TypeVar


class Dependent(Protocol):
    """A stage or its view: an id and the ids it depends on."""

    @property
    def id(self) -> str: ...
    @property
    def depends_on(self) -> tuple[str, ...]: ...


D = TypeVar("D", bound=Dependent)


def dependency_order(items: Sequence[D], rank: Callable[[D], int] = lambda _: 0) -> tuple[list[D], list[D]]:
    """(ordered, cyclic): every item after the items it depends on, the lowest `rank` first among those
    whose dependencies are all placed, then the given order; `cyclic` holds, in the given order, the
    items in or after a dependency cycle, which no order can place. Dependencies outside `items`
    (and on itself) are ignored."""
    index = {item.id: i for i, item in enumerate(items)}
    waiting = {item.id: {d for d in item.depends_on if d in index and d != item.id} for item in items}
    dependents: dict[str, list[str]] = {item.id: [] for item in items}
    for sid, deps in waiting.items():
        for d in deps:
            dependents[d].append(sid)

    def key(sid: str) -> tuple[int, int, str]:
        return rank(items[index[sid]]), index[sid], sid

    ready = [key(sid) for sid, deps in waiting.items() if not deps]
    heapq.heapify(ready)
    out: list[D] = []
    while ready:
        *_, sid = heapq.heappop(ready)
        out.append(items[index[sid]])
        for nxt in dependents[sid]:
            waiting[nxt].discard(sid)
            if not waiting[nxt]:
                heapq.heappush(ready, key(nxt))
    placed = {item.id for item in out}
    return out, [item for item in items if item.id not in placed]


def listing_order(items: Sequence[D], rank: Callable[[D], int] = lambda _: 0) -> list[D]:
    """dependency_order as one list: the items a cycle leaves unplaced (refused by the plan's lint) last."""
    ordered, cyclic = dependency_order(items, rank)
    return ordered + cyclic


def find_cycle(items: Sequence[Dependent]) -> list[str] | None:
    """One dependency cycle as [a, b, ..., a], or None. Every item the ordering could not place waits
    on another unplaced one, so following the first such dependency from the first of them meets a cycle."""
    _, cyclic = dependency_order(items)
    if not cyclic:
        return None
    left = {item.id: item for item in cyclic}
    path = [cyclic[0].id]
    while True:
        nxt = next(d for d in left[path[-1]].depends_on if d in left and d != path[-1])
        if nxt in path:
            return path[path.index(nxt):] + [nxt]
        path.append(nxt)

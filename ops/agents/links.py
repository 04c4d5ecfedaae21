"""Which plan stage backs which agent todo item: explicit links, plan patterns, and suggestions.

An item is linked, in this order, by
1. an explicit link (`nodedeck todo link ITEM STAGE`), kept in the node's state by the item's text;
2. a stage's `todo = ["pattern", ...]` in the plan: each pattern is matched case-insensitively
   anywhere in the item's text, `*` and `?` as wildcards (the longest matching pattern wins).
Anything else gets at most a suggestion (item words shared with a stage's id, title and
command), which is shown and never applied.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ops.agents.todos import AgentItem, normalize
from ops.errors import UserError
from ops.plan.records import Stage

KV_LINKS = "agents/links"
_WORD = re.compile(r"[a-z0-9]+")
_STOP = {"the", "and", "for", "with", "run", "from", "into", "then", "all", "each", "use", "using", "a", "an",
         "to", "of", "on", "in", "it", "is", "be", "by", "at", "as", "or", "step", "stage", "task", "todo"}


@dataclass(frozen=True)
class StageLink:
    stage_id: str
    how: str                           # "explicit" | "plan"
    pattern: str | None = None         # the plan pattern that matched


@dataclass(frozen=True)
class Suggestion:
    stage_id: str
    words: tuple[str, ...]             # the words the item shares with the stage


class LinkStore:
    """Explicit item -> stage links of a node, kept in its StateStore by the item's normalised text."""

    def __init__(self, store):
        self.store = store

    def all(self) -> dict[str, str]:
        raw = self.store.kv_get(KV_LINKS, {})
        return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}

    def link(self, item: AgentItem, stage_id: str) -> None:
        links = self.all()
        links[item.key] = stage_id
        self.store.kv_set(KV_LINKS, links)

    def unlink(self, item: AgentItem) -> bool:
        links = self.all()
        if links.pop(item.key, None) is None:
            return False
        self.store.kv_set(KV_LINKS, links)
        return True


def _glob(pattern: str) -> str:
    return "*" + normalize(pattern).replace("[", "[[]") + "*"


def plan_link(item: AgentItem, stages: Sequence[Stage]) -> StageLink | None:
    best: StageLink | None = None
    text = item.key
    for stage in stages:
        for pattern in stage.todo:
            if fnmatch.fnmatchcase(text, _glob(pattern)) and (best is None or len(pattern) > len(best.pattern or "")):
                best = StageLink(stage.id, "plan", pattern)
    return best


def link_for(item: AgentItem, stages: Sequence[Stage], explicit: dict[str, str]) -> StageLink | None:
    known = {s.id for s in stages}
    stage_id = explicit.get(item.key)
    if stage_id in known:
        return StageLink(stage_id, "explicit")
    return plan_link(item, stages)


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in _STOP}


def suggest(item: AgentItem, stages: Sequence[Stage]) -> Suggestion | None:
    """The stage sharing the most words with the item (id words count double), if clearly the best."""
    words = _words(item.content)
    scored = []
    for stage in stages:
        id_words = _words(stage.id.replace("_", " ").replace("-", " ").replace(".", " "))
        other = _words(stage.title) | _words(stage.command if isinstance(stage.command, str)
                                             else " ".join(stage.command))
        shared = words & (id_words | other)
        score = 2 * len(words & id_words) + len(words & other - id_words)
        if score >= 2:
            scored.append((score, stage.id, tuple(sorted(shared))))
    if not scored:
        return None
    scored.sort(key=lambda s: -s[0])
    if len(scored) > 1 and scored[1][0] == scored[0][0]:
        return None
    return Suggestion(scored[0][1], scored[0][2])


def find_item(items: Iterable[AgentItem], ref: str) -> AgentItem:
    """`#N` (its position), its exact text, or text found in exactly one item (case-insensitive)."""
    items = list(items)
    if ref.startswith("#") and ref[1:].isdigit():
        n = int(ref[1:])
        for item in items:
            if item.position == n:
                return item
        raise UserError(f"no item #{n} (the list has {len(items)})")
    key = normalize(ref)
    exact = [i for i in items if i.key == key]
    if exact:
        return exact[0]
    found = [i for i in items if key in i.key]
    if len(found) == 1:
        return found[0]
    if not found:
        raise UserError(f"no todo item matches {ref!r}")
    raise UserError(f"{ref!r} matches {len(found)} items (#{', #'.join(str(i.position) for i in found[:6])}): "
                    "give #N or more of the text")

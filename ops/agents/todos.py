"""Typed records of coding agents' todo lists (opencode, Claude Code, todowrite files)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ops.errors import UserError


class Agent(str, enum.Enum):
    OPENCODE = "opencode"
    CLAUDE = "claude"
    TODOWRITE = "todowrite"


@dataclass(frozen=True)
class AgentItem:
    """One item as the agent wrote it; `position` is its 1-based place in the list. Status and priority are
    the agent's own words, kept verbatim (opencode stores any word, e.g. `blocked`, `urgent`): only
    `completed` claims completion."""

    position: int
    content: str                       # Claude Code's Task tools: the task's subject
    status: str                        # pending | in_progress | completed | cancelled | the agent's own word
    priority: str | None = None        # high | medium | low (or the agent's own word), where it keeps one
    active_form: str | None = None     # Claude Code's "doing" phrase
    id: str | None = None              # a task's id, older opencode items, todowrite files; newer opencode: none
    description: str | None = None     # Claude Code's Task tools
    blocks: tuple[str, ...] = ()       # ids of the tasks this one blocks (the agent's own dependency graph)
    blocked_by: tuple[str, ...] = ()   # ids of the tasks that block this one

    @property
    def key(self) -> str:
        """How the item is known across rewrites of the list: its text, normalised."""
        return normalize(self.content)

    def to_json(self) -> dict:
        return {"position": self.position, "id": self.id, "content": self.content, "status": self.status,
                "priority": self.priority, "active_form": self.active_form, "description": self.description,
                "blocks": list(self.blocks), "blocked_by": list(self.blocked_by)}


def positions(items: Sequence[AgentItem]) -> dict[str, int]:
    """Each item's id -> its place in the list: what `dependencies` names a task by. Built once per list (once
    per item was quadratic in a long list)."""
    return {i.id: i.position for i in items if i.id is not None}


def dependencies(item: AgentItem, where: Mapping[str, int]) -> str:
    """The agent's own graph around one item: `blocked by #1, #3; blocks #4` ('' when it has none). A task is
    named by its place in the list (`where`: positions() of it), or `task ID` when the list does not hold it."""

    def named(ids: tuple[str, ...]) -> str:
        return ", ".join(f"#{where[t]}" if t in where else f"task {t}" for t in ids)

    parts = ([f"blocked by {named(item.blocked_by)}"] if item.blocked_by else []) + (
        [f"blocks {named(item.blocks)}"] if item.blocks else [])
    return "; ".join(parts)


@dataclass(frozen=True)
class AgentList:
    """One session's todo list; `error` (one line) when the file could not be read as its agent writes it."""

    agent: Agent
    agent_session: str  # the agent's own session id
    path: str
    updated: float | None
    project: str | None = None
    items: tuple[AgentItem, ...] = ()
    error: str | None = None
    node: str = "local"

    @property
    def spec(self) -> str:
        """The name `--follow-agent` takes for exactly this list."""
        return f"{self.agent.value}:{self.agent_session}"

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for item in self.items:
            out[item.status] = out.get(item.status, 0) + 1
        return out

    def to_json(self, *, with_items: bool = True) -> dict:
        doc: dict[str, Any] = {"agent": self.agent.value, "session": self.agent_session, "node": self.node,
                               "project": self.project, "path": self.path, "updated": self.updated,
                               "counts": self.counts(), "error": self.error}
        if with_items:
            doc["items"] = [i.to_json() for i in self.items]
        return doc


@dataclass(frozen=True)
class AgentSpec:
    """`opencode`, `opencode:SESSION`, `claude[:SESSION]`, or `todowrite:PATH`; no session: the newest."""

    agent: Agent
    agent_session: str | None = None
    files: tuple[str, ...] = field(default=())

    @property
    def scanned(self) -> tuple[str, ...]:
        """The agents whose stores are scanned for it (a todowrite file is read by path, no store)."""
        return () if self.agent is Agent.TODOWRITE else (self.agent.value,)

    @classmethod
    def parse(cls, text: str) -> "AgentSpec":
        name, _, rest = text.partition(":")
        try:
            agent = Agent(name.strip().lower())
        except ValueError:
            raise UserError(f"unknown agent {name!r}: use opencode, claude or todowrite:FILE "
                            "(optionally :SESSION)") from None
        if agent is Agent.TODOWRITE:
            if not rest:
                raise UserError("todowrite needs a file: todowrite:PATH")
            return cls(agent, rest, (rest,))
        return cls(agent, rest or None)


def normalize(text: str) -> str:
    return " ".join(text.lower().split())

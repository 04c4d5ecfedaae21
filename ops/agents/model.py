"""Typed records of coding agents' todo lists (opencode, Claude Code, todowrite files)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Agent(str, enum.Enum):
    OPENCODE = "opencode"
    CLAUDE = "claude"
    TODOWRITE = "todowrite"


@dataclass(frozen=True)
class AgentItem:
    """One item as the agent wrote it; `position` is its 1-based place in the list."""

    position: int
    content: str
    status: str                        # pending | in_progress | completed | cancelled (Claude: no cancelled)
    priority: str | None = None        # high | medium | low, where the agent keeps one
    active_form: str | None = None     # Claude Code's "doing" phrase
    id: str | None = None              # opencode's older items and todowrite files; newer opencode has none

    @property
    def key(self) -> str:
        """How the item is known across rewrites of the list: its text, normalised."""
        return normalize(self.content)

    def to_json(self) -> dict:
        return {"position": self.position, "id": self.id, "content": self.content, "status": self.status,
                "priority": self.priority, "active_form": self.active_form}


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
        from ops.errors import UserError

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

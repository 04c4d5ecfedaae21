"""Follow one coding agent's todo list live: re-read when its files change, keep the last good list."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ops.agents import scan
from ops.agents.discover import find, is_local
from ops.agents.todos import AgentItem, AgentList, AgentSpec
from ops.errors import NodedeckError
from ops.hosts.base import Host

RACY_S = 2.0                       # mtimes this recent are not trusted to show every change


@dataclass(frozen=True)
class AgentFollowState:
    """One poll: the list now (the last good one when the newest read failed) and whether it changed."""

    source: AgentList | None           # the list followed (session, path); None before one was found
    items: tuple[AgentItem, ...]
    error: str | None                  # the newest read failed (a write caught half-way, a bad field)
    changed: bool
    read_at: float


class AgentFollower:
    """Follows `opencode[:SESSION]`, `claude[:SESSION]` or `todowrite:PATH` on this machine or a node.

    Without a session it follows the agent's newest list, switching when the agent starts a new
    session. Locally, files are re-read only when their (mtime, size) changed; on a node every poll
    is one small python3 command over the node's connection.
    """

    def __init__(self, spec: AgentSpec | str, host: Host | None = None):
        self.spec = AgentSpec.parse(spec) if isinstance(spec, str) else spec
        self.host = host
        self.source: AgentList | None = None
        self.items: tuple[AgentItem, ...] = ()
        self.error: str | None = None
        self._sig: tuple | None = None

    @property
    def label(self) -> str:
        where = "" if self.host is None or is_local(self.host) else f" on {self.host.name}"
        if self.source is None:
            return f"{self.spec.agent.value}{':' + self.spec.agent_session if self.spec.agent_session else ''}{where}"
        return f"{self.source.spec}{where}"

    def _unchanged(self) -> bool:
        if not is_local(self.host):
            return False
        sig = scan.signature(os.path.expanduser("~"), dict(os.environ), self.spec.files, self.spec.scanned)
        # a file modified within the last RACY_S may be rewritten again inside the same mtime tick with the
        # same size (completed -> cancelled): such a signature proves nothing, so it is read again
        racy = any(time.time_ns() - mtime_ns < RACY_S * 1e9 for _, mtime_ns, _ in sig)
        same = sig == self._sig and self.error is None and not racy
        self._sig = sig
        return same

    def poll(self) -> AgentFollowState:
        now = time.time()
        if self._unchanged():
            return AgentFollowState(self.source, self.items, self.error, False, now)
        try:
            found = find(self.host, self.spec)
        except NodedeckError as e:
            return self._failed(str(e), now)
        if found.error:
            if self.source is None:
                self.source = found
            return self._failed(found.error, now)
        changed = (self.source is None or found.spec != self.source.spec or found.items != self.items
                   or self.error is not None)
        self.source, self.items, self.error = found, found.items, None
        return AgentFollowState(found, found.items, None, changed, now)

    def _failed(self, error: str, now: float) -> AgentFollowState:
        changed = error != self.error
        self.error = error
        return AgentFollowState(self.source, self.items, error, changed, now)

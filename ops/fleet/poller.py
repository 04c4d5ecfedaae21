"""Fleet: every node polled in parallel, each node with its own backoff.

`snapshot()` never waits: it returns each node's latest NodeStatus (marked `polling` while a poll
is under way). Each node has at most one poll in flight, in a (daemon) thread of its own, so a dead
or slow node never holds a thread a live one needs, nor a one-shot run past its deadline.
A dead node's poll is one connection attempt (at most its connect_timeout, see NodeWatch), and it
is polled again only after its backoff (1 s doubling to 60 s); a live node is polled every interval
(from one poll's start to the next: ticked every interval, every tick polls it).
A row says up as soon as its node's connection is made, before that poll's telemetry is read.
CLI: `nodedeck fleet [--json] [--watch]`; the TUI's fleet screen reads the same snapshots.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Callable, Sequence

from ops.fleet.status import NodeStatus
from ops.fleet.watch import NodeWatch
from ops.nodes import NodeConfig

MAX_BACKOFF_S = 60.0
DUE_SLACK = 0.1
"""A poll due within this fraction of the interval starts with this tick (a timer may fire a little early)."""


class Fleet:
    def __init__(self, nodes: Sequence[NodeConfig], *, interval: float = 1.0, accept_new_host_key: bool = False,
                 timeout: float = 10.0, make_watch: Callable[[NodeConfig], NodeWatch] | None = None):
        make = make_watch or (lambda n: NodeWatch(n, accept_new_host_key=accept_new_host_key, timeout=timeout,
                                                  stream_interval=interval))
        self.interval = interval
        self.watches = {n.name: make(n) for n in nodes}
        self._status = {n.name: NodeStatus(n.name, n.target, None) for n in nodes}
        self._due = {n.name: 0.0 for n in nodes}
        self._fails = {n.name: 0 for n in nodes}
        self._inflight: dict[str, threading.Event] = {}   # set when the node's poll in flight ends
        self._lock = threading.Lock()
        self._closed = False

    def tick(self, now: float | None = None) -> None:
        """Start the polls that are due (never a second one for a node still being polled)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._closed:
                return
            for name, watch in self.watches.items():
                if name in self._inflight or now < self._due[name] - DUE_SLACK * self.interval:
                    continue
                self._status[name] = replace(self._status[name], polling=True)
                self._inflight[name] = threading.Event()
                threading.Thread(target=self._poll, args=(name, watch, now), name=f"fleet {name}",
                                 daemon=True).start()

    def _poll(self, name: str, watch: NodeWatch, started: float) -> None:
        try:
            status = watch.poll(on_connected=lambda: self._connected(name))
        except Exception as e:                      # a bug in one node's poll must not stop the others
            status = NodeStatus(name, watch.node.target, False, f"poll failed: {e}", time.time())
        now = time.monotonic()
        with self._lock:
            self._inflight.pop(name).set()
            self._status[name] = replace(status, polling=False)
            if status.reachable:
                self._fails[name] = 0
                # a second after the poll started (1 Hz), but a slow node rests at least half an interval
                self._due[name] = max(started + self.interval, now + self.interval / 2)
            else:
                self._fails[name] += 1
                self._due[name] = now + min(MAX_BACKOFF_S, self.interval * 2 ** (self._fails[name] - 1))

    def _connected(self, name: str) -> None:
        """The node's poll just connected: its row says up (its telemetry still coming) before the poll ends."""
        with self._lock:
            self._status[name] = replace(self._status[name], reachable=True, error=None, polling=True)

    def snapshot(self) -> list[NodeStatus]:
        with self._lock:
            return [self._status[n] for n in self.watches]

    def poll_all(self, timeout: float = 30.0) -> list[NodeStatus]:
        """One round (for the CLI): poll every node once, waiting at most `timeout` for the slow ones."""
        self.tick()
        deadline = time.monotonic() + timeout
        with self._lock:
            running = list(self._inflight.values())
        for done in running:
            done.wait(max(0.0, deadline - time.monotonic()))
        return self.snapshot()

    def settle_hooks(self, grace: float) -> list[str]:
        """For a one-shot run before it exits: wait up to `grace` for the on_alert hooks still running;
        the failures of those that ended, and one line per hook left running (it goes on, and is
        stopped at its own timeout)."""
        deadline = time.monotonic() + grace
        lines = []
        for watch in self.watches.values():
            watch.hooks.wait(max(0.0, deadline - time.monotonic()))
            lines += watch.hooks.reports()
            lines += [f"on_alert for {key} still runs after {grace:g}s; it is stopped at {watch.hooks.timeout:g}s"
                      for key in watch.hooks.running()]
        return lines

    def close(self) -> None:
        with self._lock:
            self._closed = True
        for watch in self.watches.values():
            threading.Thread(target=watch.close, daemon=True).start()   # a hung transport never blocks quitting

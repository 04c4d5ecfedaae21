"""From findings to alerts with `since`, kept in the node's state; `on_alert` runs once per new alert.

A finding seen again within `max_gap_s` of the last observation keeps its first-seen time; one
that was not seen, or not observed for longer (nobody was watching), starts over. An alert is
raised when its finding has held for its `hold_s`. `on_alert` (a node's command, ops.alerts.hooks) runs
once per alert: the claim (by key) is an atomic insert in the node's SQLite state, so two nodedeck processes
watching the same node never both run it, and it is released only when an observation finds the
condition gone, so one-shot runs (`nodedeck alerts` from cron) never re-announce a standing alert.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

from ops.alerts.records import Alert
from ops.alerts.rules import Finding
from ops.state import StateStore

KV_SEEN = "alerts/seen"                  # {key: [first_seen, last_seen]}
KV_FIRED = "alerts/fired/"               # + key -> the alert as JSON, while it stands


class AlertTracker:
    def __init__(self, store: StateStore, *, max_gap_s: float = 300.0):
        self.store = store
        self.max_gap_s = max_gap_s

    def update(self, node: str, findings: Sequence[Finding], now: float | None = None) -> list[Alert]:
        """The alerts of `node` active now (their findings held long enough), oldest first."""
        now = time.time() if now is None else now
        seen_all = self.store.kv_get(KV_SEEN, {})
        seen = {k: v for k, v in seen_all.items() if not k.startswith(f"{node}/")}
        now_keys = {f.alert.key for f in findings}
        for gone in [k for k in seen_all if k.startswith(f"{node}/") and k not in now_keys]:
            self.store.kv_delete(f"{KV_FIRED}{gone}")          # resolved: its return is a new alert
        active = []
        for f in findings:
            first, last = seen_all.get(f.alert.key, (now, now))
            if now - last > self.max_gap_s:
                first = now
            seen[f.alert.key] = (first, now)
            if now - first >= f.hold_s:
                active.append(replace(f.alert, since=first))
        if len(seen) != len(seen_all) or findings:          # nothing of this node seen, now or before: no write
            self.store.kv_set(KV_SEEN, seen)
        return sorted(active, key=lambda a: a.since or 0.0)

    def claim_new(self, alerts: Sequence[Alert]) -> list[Alert]:
        """The alerts not announced before; each is claimed by exactly one caller, once."""
        return [a for a in alerts if self.store.kv_add(f"{KV_FIRED}{a.key}", a.to_json())]

    def release(self, alert: Alert) -> None:
        """Give back a claim whose hook could not run, so a later observation claims and runs it again."""
        self.store.kv_delete(f"{KV_FIRED}{alert.key}")

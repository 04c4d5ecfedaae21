"""Alerts for the failures people noticed too late, computed from what nodedeck already collects.

`model` (Alert, AlertKind, Thresholds), `rules` (pure functions: data -> findings), `tracker`
(findings -> alerts with `since`, `on_alert` once per alert). ops.fleet gathers the inputs per node.
"""

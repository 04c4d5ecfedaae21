"""Alerts for the failures people noticed too late, computed from what nodedeck already collects.

`records` (Alert, AlertKind, Severity, Thresholds), `rules` (pure functions: data -> findings), `tracker`
(findings -> alerts with `since`, each claimed once), `hooks` (`on_alert` in the background).
ops.fleet gathers the inputs per node.
"""

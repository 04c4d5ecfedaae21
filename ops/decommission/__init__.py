"""Preserving a node before it is shut down.

Entry points: `session.open_decommission(node, Options(...))` (a configured node,
as the CLI uses it), `session.decommission_for(NodeHandle, ...)` /
`session.decommission_on(Host, NodeConfig, ...)`, each giving a
`wizard.Decommission` whose `run()` does every step and returns the SafetyVerdict.

Layout: `wizard` holds a run's state and its step sequence; `selection` (policies
to actions), `download`, `verify` and `verdict` do the steps; `events` is what the
wizard reports, `results` the frozen records it yields, and `report`/`manifest`
render a `DecommissionResult` into PROGRESS.md and manifest.json.
"""

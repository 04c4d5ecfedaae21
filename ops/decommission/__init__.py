"""Preserving a node before it is shut down.

Entry points: `session.open_decommission(node, Options(...))` (a configured node,
as the CLI uses it), `session.decommission_for(NodeSession, ...)` /
`session.decommission_on(Host, NodeConfig, ...)`, each giving a
`wizard.Decommission` whose `run()` does every step and returns the Verdict.
"""

"""Coding agents' todo lists (opencode, Claude Code, todowrite files) held against the node.

Entry points: `discover` / `select` (find lists, here or on a node), `AgentFollower` (follow one
live), `audit` (each claim verified, unbacked, contradicted, agrees or unlinked), `LinkStore`
(explicit item -> stage links) and `export_as` (the node's truth in an agent's format).
"""

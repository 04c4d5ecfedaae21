"""Every problem `nodedeck plan check` finds in a plan file, in one run, sorted by line.

The file against the schema (ops.plan.schema), what spans its stages (ids, dependencies, cycles), the static
checks of its commands (ops.plan.lint) and the nodes its multi-node stages name (nodes.toml): the last two on
the stages and keys that are right when others are wrong. What a node lacks for the plan (`--node`) is the
CLI's: it probes the node.
"""

from __future__ import annotations

from pathlib import Path

from ops.errors import UserError
from ops.inputfile import read_input
from ops.nodes import NodeConfig, get_node, load_nodes
from ops.plan.lint import PlanLinter
from ops.plan.locate import SourceMap
from ops.plan.parse import inspect_plan
from ops.plan.records import Finding, Plan


def check_file(path: str | Path, nodes_config: str | Path | None = None) -> tuple[Plan | None, list[Finding]]:
    """(the plan, or the part of it that is right, or None; every problem of the file)."""
    p = Path(path)
    try:
        raw = read_input(p, "plan")
    except UserError as e:
        return None, [Finding(str(p), None, str(e).removeprefix(f"{p}: "))]
    plan, findings = inspect_plan(raw, str(p))
    if plan is not None:
        text = raw.decode("utf-8")
        findings += PlanLinter(plan, text, str(p)).run()
        if any(s.nodes for s in plan.stages):
            findings += unknown_nodes(plan, text, str(p), load_nodes(nodes_config))
    return plan, in_order(findings)


def unknown_nodes(plan: Plan, text: str, filename: str, nodes: dict[str, NodeConfig]) -> list[Finding]:
    """`nodes: unknown node ...` for each node a stage's `nodes` names that the nodes file does not have (or has
    with a wrong section)."""
    where = SourceMap(text)
    out = []
    for stage in plan.stages:
        for name in stage.nodes:
            try:
                get_node(nodes, name)
            except UserError as e:
                out.append(Finding(filename, where.line_of(("stage", _index(where, stage.line), "nodes")),
                                   f"nodes: {e}", stage.id))
    return out


def _index(where: SourceMap, header: int | None) -> int:
    return next((i for i, s in enumerate(where.stages) if s.header == header), len(where.stages))


def in_order(findings: list[Finding]) -> list[Finding]:
    """Once each, by line (those about no line last), in the order found within a line."""
    return sorted(dict.fromkeys(findings), key=lambda f: (f.line is None, f.line or 0))

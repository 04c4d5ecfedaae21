"""Which plans run on a node: recorded in the node's state when a stage launches, read by the fleet.

Each entry is the plan file and the variables it ran with, so a reader (the fleet's NodeWatch)
resolves stage paths (metrics files, results) exactly as the scheduler that launched them did.
"""

from __future__ import annotations

from pathlib import Path

from ops.errors import NodedeckError
from ops.plan.parse import load_plan
from ops.plan.records import Plan
from ops.plan.resolve import apply_overrides

KV_PLANS = "plans/"                      # + plan name -> {"path": plan file, "vars": {...}}


def record_plan(store, plan: Plan) -> None:
    """Remember that `plan` (its file and variables) runs on the node whose state this is."""
    if plan.path:
        store.kv_set(f"{KV_PLANS}{plan.name}", {"path": str(Path(plan.path).resolve()), "vars": dict(plan.vars)})


def recorded_plans(store) -> list[Plan]:
    """The plans recorded on this node, with their variables; a moved or broken plan file is left out."""
    out = []
    for key in store.kv_keys(KV_PLANS):
        entry = store.kv_get(key) or {}
        try:
            plan = load_plan(entry["path"])
            out.append(apply_overrides(plan, {k: v for k, v in (entry.get("vars") or {}).items() if k in plan.vars}))
        except (NodedeckError, OSError, KeyError, TypeError):
            continue
    return out

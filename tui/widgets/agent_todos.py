"""The followed coding agent's todo list in the todo panel: every item whole, with its claim verdict.

Contradicted claims (the node shows otherwise) are red with the reason; a full-size run whose smoke
run never verified is flagged. `newly_contradicted` says which items just became contradicted, so
the panel notifies once per item. CLI: `nodedeck todo audit --plan FILE --agent SPEC`.
"""

from __future__ import annotations

from typing import Mapping

from rich.text import Text
from textual.widgets import Static

from ops.agents.audit import Claim, ItemAudit
from ops.agents.todos import dependencies, positions
from ops.textsafe import shown
from tui.source import AgentTodosView

AGENT_GLYPH = {"pending": "☐", "in_progress": "◐", "completed": "☑", "cancelled": "☒"}
CLAIM_STYLE = {
    Claim.VERIFIED: ("✓ verified", "green"),
    Claim.AGREES: ("= agrees", "dim"),
    Claim.UNBACKED: ("? unbacked", "yellow"),
    Claim.UNLINKED: ("· unlinked", "dim"),
    Claim.CONTRADICTED: ("✗ CONTRADICTED", "bold white on red"),
}


def audit_text(a: ItemAudit, where: Mapping[str, int] | None = None, depends_on: tuple[str, ...] = (),
               link: str | None = None) -> Text:
    """`☑ Train the drafter  completed` then the agent's own dependency graph beside the plan's (`blocked by
    #1 · plan: after prep`), then the verdict and its evidence (the reason, whole), then the suggested stage and
    `link`, the command that links the item to it."""
    t = Text()
    t.append(f"{AGENT_GLYPH.get(a.item.status, '?')} ", style="red" if a.problem else "")
    t.append(shown(a.item.content), style="bold red" if a.claim is Claim.CONTRADICTED else "")
    t.append(f"  {shown(a.item.status)}", style="dim")
    graph = dependencies(a.item, where or {})
    if graph:
        t.append(f"\n  {shown(graph)}", style="cyan")
        if a.link is not None and depends_on:
            t.append(f" · plan: stage {shown(a.link.stage_id)} after {shown(', '.join(depends_on))}", style="dim")
    label, style = CLAIM_STYLE[a.claim]
    t.append("\n  ")
    t.append(label, style=style)
    t.append(f"  {shown(a.reason)}", style="red" if a.claim is Claim.CONTRADICTED else "dim")
    if a.smoke_missing:
        t.append("\n  ")
        t.append("⚠ SMOKE RUN MISSING", style="bold yellow")
        t.append(f" before the full-size run of {shown(a.link.stage_id)}" if a.link else "", style="yellow")
    if a.suggestion is not None and a.link is None:
        how = f" ({shown(link)})" if link else ""
        t.append(f"\n  suggested stage {shown(a.suggestion.stage_id)}{how}", style="dim italic")
    return t


def agent_widgets(view: AgentTodosView) -> list[Static]:
    """The section's rows: a header with the counts, the read error if any, then every item."""
    header = Text(f"coding agent's todo list · {shown(view.label)}", style="bold")
    if view.summary:
        header.append(f" · {shown(view.summary)}", style="red" if any(a.problem for a in view.audits) else "dim")
    rows = [Static(header, classes="todo todo-header agent-header")]
    if view.error:
        rows.append(Static(Text(f"last read failed: {shown(view.error)}", style="yellow"), classes="todo"))
    if not view.audits:
        rows.append(Static(Text("(no items)", style="dim"), classes="todo"))
    where = positions([a.item for a in view.audits])
    for a in view.audits:
        classes = "todo agent-item" + (" -contradicted" if a.claim is Claim.CONTRADICTED else "")
        depends_on = view.depends_on.get(a.link.stage_id, ()) if a.link is not None else ()
        rows.append(Static(audit_text(a, where, depends_on, view.links.get(a.item.position)), classes=classes))
    return rows


def contradicted(view: AgentTodosView | None) -> dict[str, ItemAudit]:
    """Contradicted items by their key (their normalised text)."""
    if view is None:
        return {}
    return {a.item.key: a for a in view.audits if a.claim is Claim.CONTRADICTED}

"""Textual's compositor, asking only the widgets that show in a changed region for their lines.

On a partial update Textual renders every widget under the rectangle around all the changed
regions, then writes only the changed spans. On the dashboard those regions are a few rows spread
over the whole screen (the clock, the GPU rows, the charts, the running stage), so the rectangle is
the screen and every panel, row and scrollbar renders its lines each second, to be thrown away.
Here a widget is rendered only when a changed region shows some of it: meets its visible area
outside the area of each one of its children (a container whose changed rows all lie inside a child
is drawn over there, so it is not asked for them). What reaches the
terminal is the same: every column of a changed span lies in a changed region, so the widgets on
top there are all rendered (tests/test_tui_compositor.py holds the two outputs equal on every update
of a live dashboard, and what the compositor caches for later updates equal to Textual's). A Textual
without the internals this relies on keeps its own compositor.
"""

from __future__ import annotations

from typing import Sequence

from textual._compositor import ChopsUpdate, Compositor
from textual.geometry import Region

Edges = tuple[int, int, int, int]
"""A region as (left, top, right, bottom), right and bottom exclusive."""


class ChangedOnlyCompositor(Compositor):
    """A partial update renders the widgets that show in a changed region, not all under their union."""

    def render_partial_update(self) -> ChopsUpdate | None:
        changed = list(self._dirty_regions)
        if not changed:
            return super().render_partial_update()
        visible = self.visible_widgets
        _ = self.cuts, self.layers_visible   # both cached now from every visible widget (later updates and the
        # mouse reuse them), not from the few this update renders
        areas = {widget: region.intersection(clip) for widget, (region, clip) in visible.items()}
        children: dict[object, list[Edges]] = {}
        for widget, area in areas.items():
            if widget._parent in areas:
                children.setdefault(widget._parent, []).append(_edges(area))
        regions = [_edges(r) for r in changed]
        only = {widget: visible[widget] for widget, area in areas.items()
                if _shows(area, regions, children.get(widget, ()))}
        self._visible_widgets = only
        try:
            return super().render_partial_update()
        finally:
            if self._visible_widgets is only:   # (nothing rebuilt the map meanwhile)
                self._visible_widgets = visible


def _shows(area: Region, regions: list[Edges], children: Sequence[Edges]) -> bool:
    """Some cell of a changed region in area is the widget's own: not under one of its children (a
    child is drawn over its parent), so it must be rendered. Regions as their edges (plain tuples: this
    runs for every visible widget and changed region of every update)."""
    ax1, ay1, aw, ah = area
    ax2, ay2 = ax1 + aw, ay1 + ah
    for rx1, ry1, rx2, ry2 in regions:
        if rx1 < ax2 and ax1 < rx2 and ry1 < ay2 and ay1 < ry2:
            px1, py1, px2, py2 = max(ax1, rx1), max(ay1, ry1), min(ax2, rx2), min(ay2, ry2)
            if not any(cx1 <= px1 and cy1 <= py1 and px2 <= cx2 and py2 <= cy2 for cx1, cy1, cx2, cy2 in children):
                return True
    return False


def _edges(r: Region) -> Edges:
    return r.x, r.y, r.x + r.width, r.y + r.height


def supported() -> bool:
    """This Textual keeps the changed regions and the visible widgets where the override reads them."""
    probe = Compositor()
    return isinstance(getattr(probe, "_dirty_regions", None), set) and all(
        hasattr(probe, name) for name in ("_visible_widgets", "_cuts", "_layers_visible", "cuts", "layers_visible"))

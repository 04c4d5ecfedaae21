"""Textual's compositor, asking only the widgets that meet a changed region for their lines.

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


class ChangedOnlyCompositor(Compositor):
    """A partial update renders the widgets that meet a changed region, not all under their union."""

    def render_partial_update(self) -> ChopsUpdate | None:
        changed = list(self._dirty_regions)
        if not changed:
            return super().render_partial_update()
        visible = self.visible_widgets
        _ = self.cuts, self.layers_visible   # both cached now from every visible widget (later updates and the
        # mouse reuse them), not from the few this update renders
        areas = {widget: region.intersection(clip) for widget, (region, clip) in visible.items()}
        children: dict[object, list[Region]] = {}
        for widget, area in areas.items():
            if widget._parent in areas:
                children.setdefault(widget._parent, []).append(area)
        only = {widget: visible[widget] for widget, area in areas.items()
                if _shows(area, changed, children.get(widget, ()))}
        self._visible_widgets = only
        try:
            return super().render_partial_update()
        finally:
            if self._visible_widgets is only:   # (nothing rebuilt the map meanwhile)
                self._visible_widgets = visible


def _meets(area: Region, regions: list[Region]) -> bool:
    overlaps = area.overlaps
    return any(overlaps(r) for r in regions)


def _shows(area: Region, regions: list[Region], children: Sequence[Region]) -> bool:
    """Some cell of a changed region in area is the widget's own: not under one of its children (a
    child is drawn over its parent), so it must be rendered."""
    for r in regions:
        part = area.intersection(r)
        if part.area and not any(child.contains_region(part) for child in children):
            return True
    return False


def supported() -> bool:
    """This Textual keeps the changed regions and the visible widgets where the override reads them."""
    probe = Compositor()
    return isinstance(getattr(probe, "_dirty_regions", None), set) and all(
        hasattr(probe, name) for name in ("_visible_widgets", "_cuts", "_layers_visible", "cuts", "layers_visible"))

"""Rows handed out as drawn (tui.widgets.lines.plain_lines) give the cells Textual's own styling would,
and a widget whose styles add something to its rows (a border, padding, a tint, text opacity) still
goes through Textual's path."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from tests.support.tui_fixed import FixedSource
from tests.support.tui_screens import aio, wait_polled
from tui.app import NodedeckApp
from tui.widgets.charts import LineChart
from tui.widgets.gpus import GpuTable
from tui.widgets.lines import Look, TextLines, _strip, look, plain_lines
from tui.widgets.plan import StageRow


def cells(strips: list[Strip]) -> list[list[tuple[str, object]]]:
    """Each row as (character, style) per cell: what reaches the terminal, whatever the segments' cuts."""
    return [[(ch, seg.style) for seg in strip for ch in seg.text] for strip in strips]


def textual_lines(widget: Widget, crop: Region) -> list[Strip]:
    """What Textual's own render_lines gives, from nothing it kept."""
    widget._styles_cache.clear()
    return Widget.render_lines(widget, crop)


def rows_as_drawn(widget: Widget, crop: Region) -> list[Strip]:
    """The widget's rows handed out whatever its styles (with the app's line filters, which turn ANSI
    colours into the theme's): what plain_lines would give if it missed a style."""
    strips = [widget.render_line(y) for y in crop.line_range]
    for line_filter in widget.get_line_filters():
        strips = [strip.apply_filter(line_filter, widget.background_colors[1]) for strip in strips]
    return [strip.crop(crop.x, crop.right) for strip in strips]


def crops(widget: Widget) -> list[Region]:
    w, h = widget.size
    top = 1 if h > 2 else 0
    return [Region(0, 0, w, h), Region(3, top, max(1, w - 7), h - 2 * top)]


@aio
async def test_rows_handed_out_as_drawn_are_the_cells_textual_would_write():
    app = NodedeckApp(FixedSource(), refresh_s=0.5)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_polled(app, pilot)
        widgets = [w for w in app.dash.query("*") if isinstance(w, (TextLines, LineChart)) and w.size.area]
        plain = []
        for widget in widgets:
            for crop in crops(widget):
                ours = plain_lines(widget, crop)
                took_plain = not widget._styles_cache._cache   # Textual's path caches every line it renders
                assert cells(ours) == cells(textual_lines(widget, crop)), (widget, crop)
                assert [s.cell_length for s in ours] == [crop.width] * crop.height
                plain.append(took_plain)
        kinds = {type(w) for w, p in zip(widgets, plain[::2]) if p}
        assert GpuTable in kinds and LineChart in kinds   # the dashboard's busiest rows do take the short path
        rows = [w for w in widgets if isinstance(w, StageRow)]
        assert rows and not any(p for w, p in zip(widgets, plain[::2]) if isinstance(w, StageRow))  # padded


@aio
async def test_styles_that_change_the_rows_go_through_textual():
    app = NodedeckApp(FixedSource(), refresh_s=0.5)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_polled(app, pilot)
        table = app.dash.query_one(GpuTable)
        for rule, value in (("border", ("solid", "red")), ("padding", (0, 2)), ("tint", "red 40%"),
                            ("text_opacity", 0.5), ("outline", ("heavy", "blue")), ("opacity", 0.5)):
            setattr(table.styles, rule, value)
            await pilot.pause()
            full = Region(0, 0, *table.size)
            ours = plain_lines(table, full)
            assert cells(ours) == cells(textual_lines(table, full)), rule
            # the style changed the cells: handing out the rows would not do
            assert cells(ours) != cells(rows_as_drawn(table, full)), rule
            table.styles.reset()   # (clear_rule leaves the edges a shorthand such as `border` set)
            table.refresh(layout=True)
            await pilot.pause()
            assert not any(table.gutter) and not any(edge for edge, _ in table.styles.outline)
        full = Region(0, 0, *table.size)
        ours = table.render_lines(full)
        assert cells(ours) == cells(rows_as_drawn(table, full)) == cells(textual_lines(table, full))


STYLES = ("bold", "green", "dim italic", "on red", "bold magenta", "no-such-colour", "")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab █▌·→✓", max_size=30), st.sampled_from(STYLES),
       st.lists(st.tuples(st.integers(0, 32), st.integers(0, 32), st.sampled_from(STYLES)), max_size=6),
       st.integers(1, 40))
def test_a_row_s_strip_has_the_cells_rich_would_render(plain, text_style, spans, width):
    """Rows are turned into strips without Rich's per-character style stack when their spans do not overlap
    (overlapping ones, and styles Rich does not know, as Rich renders them)."""
    row = Text(plain, style=text_style)
    for start, end, style in spans:
        row.stylize(style, start, end)
    console = Console(width=80)
    base = Style(color="white", bgcolor="black")
    style = base + console.get_style(row.style, default=Style.null()) if row.style else base
    rich = list(Segment.apply_style(row.render(console, end=""), style))
    expected = Strip(rich).crop(0, width).adjust_cell_length(width, Style.from_color(bgcolor=base.bgcolor))
    assert cells([_strip(row, console, width, base)]) == cells([expected])


@aio
async def test_a_widget_s_look_follows_its_ancestors_styles():
    """The style and background a line-API widget draws over are kept between renders, and worked out
    again when a style of an ancestor changes (a panel's background, the screen's colour)."""
    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_polled(app, pilot)
        table = app.dash.query_one(GpuTable)
        panel = table.parent
        full = Region(0, 0, *table.size)
        before = look(table)
        assert look(table) is before   # nothing changed: the same, not worked out again
        for change in (lambda: setattr(panel.styles, "background", "red"),
                       lambda: setattr(app.screen.styles, "color", "yellow")):
            change()
            await pilot.pause()
            now = look(table)
            assert now != before and now == Look(table.rich_style, table.background_colors[1])
            assert cells(table.render_lines(full)) == cells(textual_lines(table, full))
            before = now

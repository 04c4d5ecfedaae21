"""Line-API widgets (tui.widgets.lines): rows become the strips Rich would render, unchanged rows keep their
strips between draws, and the rows follow the styles of the widget and its ancestors."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip

from tests.support.tui_fixed import FixedSource
from tests.support.tui_screens import aio, wait_polled
from tui.app import NodedeckApp
from tui.widgets.gpus import GpuTable
from tui.widgets.lines import text_strip
from tui.widgets.text import LiveText


def cells(strips: list[Strip]) -> list[list[tuple[str, object]]]:
    """Each row as (character, style) per cell: what reaches the terminal, whatever the segments' cuts."""
    return [[(ch, seg.style) for seg in strip for ch in seg.text] for strip in strips]


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
    assert cells([text_strip(row, console, width, base)]) == cells([expected])


@aio
async def test_rows_follow_the_styles_of_the_widget_s_ancestors():
    """A change of an ancestor's background or of the screen's colour reaches the rows drawn next."""
    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_polled(app, pilot)
        table = app.dash.query_one(GpuTable)
        panel = table.parent
        full = Region(0, 0, *table.size)
        before = cells(table.render_lines(full))
        for change, seen in ((lambda: setattr(panel.styles, "background", "red"), lambda s: s.bgcolor),
                             (lambda: setattr(app.screen.styles, "color", "yellow"), lambda s: s.color)):
            change()
            await pilot.pause()
            now = cells(table.render_lines(full))
            assert now != before
            assert seen(now[0][0][1]) == seen(table.rich_style)
            before = now


@aio
async def test_unchanged_rows_keep_their_strips_and_a_changed_row_alone_is_drawn_again():
    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_polled(app, pilot)
        text = LiveText(Text("one\ntwo\nthree"), id="probe")
        await app.dash.mount(text)
        await pilot.pause()
        first = [text.render_line(y) for y in range(3)]
        text.set_text(Text("one\nTWO\nthree"))
        await pilot.pause()
        again = [text.render_line(y) for y in range(3)]
        assert again[0] is first[0] and again[2] is first[2]
        assert again[1] is not first[1] and "".join(seg.text for seg in again[1]).startswith("TWO")

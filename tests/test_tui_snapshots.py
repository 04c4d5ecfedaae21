"""SVG snapshots of the dashboard on fixed data (fixed clock, snapshots, plan states).

Regenerate after an intended change with
`pytest tests/test_tui_snapshots.py --snapshot-update` and commit tests/__snapshots__/.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.tui_fixed import FixedSource
from tests.support.tui_screens import export_svg, use_utc, wait_polled
from tui.app import NodedeckApp


@pytest.fixture(autouse=True)
def _utc():
    use_utc()


async def _settle(pilot):
    await wait_polled(pilot.app, pilot)
    await pilot.pause(0.5)   # a loaded machine may still be drawing the strips the answers changed
    await pilot.wait_for_scheduled_animations()


def test_dashboard_120x40(snap_compare):
    assert snap_compare(NodedeckApp(FixedSource(), refresh_s=3600), terminal_size=(120, 40), run_before=_settle)


def test_dashboard_200x50(snap_compare):
    assert snap_compare(NodedeckApp(FixedSource(), refresh_s=3600), terminal_size=(200, 50), run_before=_settle)


def test_dashboard_without_gpus_120x40(snap_compare):
    """A node without GPUs says so, with the reason, instead of showing empty bars."""
    assert snap_compare(NodedeckApp(FixedSource(gpus=0), refresh_s=3600), terminal_size=(120, 40), run_before=_settle)


def test_export_screenshot_writes_the_dashboard(tmp_path):
    out = asyncio.run(export_svg(tmp_path / "screenshot.svg"))
    svg = out.read_text()
    assert svg.startswith("<svg")
    assert "gpu&#160;node&#160;1" in svg or "gpu-node-1" in svg

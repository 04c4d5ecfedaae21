"""Keys that would redo or hide a finished, verified stage ask first (issue 31, item 11)."""

from __future__ import annotations

from tests.support.tui_fixed import FixedSource
from tests.support.tui_screens import Seen, aio, screen_ready, until, wait_polled
from tui.app import NodedeckApp
from tui.screens.confirm import ConfirmFinishedScreen


async def _select(app, pilot, stage_id: str) -> None:
    await pilot.press(*["up"] * 10)
    while app.selected_stage().id != stage_id:
        await pilot.press("down")


@aio
async def test_enter_l_s_r_k_on_a_completed_stage_ask_and_cancel_keeps_it():
    src = FixedSource()
    app = NodedeckApp(src, refresh_s=3600)
    seen = Seen()
    async with app.run_test(size=(120, 40), message_hook=seen) as pilot:
        await wait_polled(app, pilot)
        await _select(app, pilot, "prep-sharegpt")   # completed: every check passed
        for key, verb in (("enter", "Run again"), ("l", "Run again"), ("s", "Smoke run"), ("r", "Run again"),
                          ("k", "Skip")):
            await pilot.press(key)
            await until(pilot, lambda: screen_ready(app, ConfirmFinishedScreen), what=f"confirmation of {key}")
            text = str(app.screen.query_one("#confirm-text").render())
            assert f"{verb}: stage prep-sharegpt" in text and "completed" in text, text
            await pilot.press("enter")   # a stray Enter lands on Cancel, the focused button
            await until(pilot, lambda: not isinstance(app.screen, ConfirmFinishedScreen), what="closed")
        assert src.calls == []
        await until(pilot, lambda: "its completed run is kept" in seen.event_text(), what="cancel event")

        await pilot.press("l")
        await until(pilot, lambda: screen_ready(app, ConfirmFinishedScreen), what="confirmation")
        await pilot.press("y")
        await until(pilot, lambda: ("start", "prep-sharegpt", False) in src.calls, what="confirmed start")
        await pilot.press("k")
        await until(pilot, lambda: screen_ready(app, ConfirmFinishedScreen), what="confirmation")
        assert "unskip" in str(app.screen.query_one("#confirm-text").render())
        await pilot.press("y")
        await until(pilot, lambda: ("skip", "prep-sharegpt") in src.calls, what="confirmed skip")


@aio
async def test_keys_on_unfinished_stages_do_not_ask_and_u_undoes_a_skip():
    src = FixedSource()
    app = NodedeckApp(src, refresh_s=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_polled(app, pilot)
        await _select(app, pilot, "vocab")   # failed: a launch or a skip loses nothing verified
        await pilot.press("l", "k")
        await until(pilot, lambda: len(src.calls) == 2, what="two actions")
        assert not isinstance(app.screen, ConfirmFinishedScreen)
        await _select(app, pilot, "bench")   # skipped
        await pilot.press("u")
        await until(pilot, lambda: ("unskip", "bench") in src.calls, what="unskip")

"""The wizard screen in a tiny host app on LocalHost: walk every step with the pilot, reach the verdict."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

from textual.app import App
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Static

from tests.support.decommission_tree import local_files, make_tree, snapshot
from tests.support.tui_screens import aio, until
from tui.live import LiveSource
from tui.screens.decommission import DecommissionScreen


class Host(App[None]):
    def __init__(self, screen: DecommissionScreen):
        super().__init__()
        self.wizard_screen = screen

    def on_mount(self) -> None:
        self.push_screen(self.wizard_screen)


def _source(tmp_path, root) -> LiveSource:
    """The dashboard's real source on node `local` (this machine), rooted at `root`."""
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{root}"\n')
    return LiveSource(config_path=cfg, node="local")


def _node(tmp_path, *names: str) -> Path:
    """The node's root, tmp_path/node, holding one-line files of these names."""
    root = tmp_path / "node"
    root.mkdir()
    for name in names:
        (root / name).write_text("x\n")
    return root


@asynccontextmanager
async def _wizard(tmp_path, root: Path, dest: Path) -> AsyncIterator[tuple[DecommissionScreen, Host, Pilot]]:
    """The wizard screen on node `local` rooted at root, in its host app, once its setup form shows."""
    screen = DecommissionScreen(_source(tmp_path, root), dest=dest)
    app = Host(screen)
    async with app.run_test(size=(120, 44)) as pilot:
        await until(pilot, lambda: screen.is_attached and screen.phase == "setup", what="setup form")
        yield screen, app, pilot


def _text(screen, wid: str) -> str:
    return str(screen.query_one(wid, Static).render())


@aio
async def test_wizard_screen_walks_every_step_to_the_verdict(tmp_path):
    root = _node(tmp_path)
    files = make_tree(root)
    before = snapshot(root)
    dest = tmp_path / "dest"
    async with _wizard(tmp_path, root, dest) as (screen, app, pilot):
        await pilot.press("enter")  # in the focused destination field
        await until(pilot, lambda: screen.phase == "select", timeout=30, what="inventory")
        table = screen.query_one("#dc-classes", DataTable)
        classes = [k.value for k in table.rows]
        assert "notes" in classes and "checkpoints" in classes
        table.move_cursor(row=classes.index("notes"))
        await pilot.press("space", "space")  # preserve -> unless-in-s3 -> skip
        assert screen.wizard.policies["notes"] == "skip"
        assert str(table.get_cell("notes", "policy")) == "skip"
        await pilot.press("c")
        await until(pilot, lambda: screen.phase == "confirm", timeout=30, what="S3 step")
        assert "excluded" in str(screen.query_one("#dc-hint", Static).render())
        assert str(table.get_cell("notes", "excluded")) == "3"
        await pilot.press("c")
        await until(pilot, lambda: screen.phase == "verdict", timeout=60, what="verdict")
        assert "SAFE TO SHUT DOWN" in _text(screen, "#dc-verdict")
        assert "excluded by choice: 3 files" in _text(screen, "#dc-verdict")
        assert all(screen.steps[name] == "done" for name in screen.steps)
        await pilot.press("escape")
        await until(pilot, lambda: not screen.is_attached, what="screen closed")
    notes = {p for p in files if screen.wizard.files[p].entry.cls == "notes"}
    assert local_files(dest) == {p: b for p, b in files.items() if p not in notes}
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["verdict"]["safe"] and manifest["policies"]["notes"] == "skip"
    assert snapshot(root) == before


@aio
async def test_wizard_screen_reports_a_bad_destination_and_lets_you_retry(tmp_path):
    root = _node(tmp_path, "a.log")
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    async with _wizard(tmp_path, root, blocker / "sub") as (screen, app, pilot):
        await pilot.press("enter")
        await until(pilot, lambda: "try again" in str(screen.query_one("#dc-hint", Static).render()),
                    timeout=30, what="error shown")
        assert "is not a directory" in str(screen.query_one("#dc-hint", Static).render())
        assert screen.phase == "setup" and screen.steps["inventory"] == "failed"
        assert screen.query_one("#dc-form").display
        await until(pilot, lambda: app.focused is screen.query_one("#dc-dest"), what="destination focused again")
        screen.query_one("#dc-dest", Input).value = str(tmp_path / "ok")
        await pilot.press("enter")
        await until(pilot, lambda: screen.phase == "select", timeout=30, what="inventory after the fix")
        assert screen.steps["inventory"] == "done"


@aio
async def test_typing_a_destination_never_starts_the_wizard(tmp_path):
    async with _wizard(tmp_path, _node(tmp_path, "a.log"), tmp_path / "default") as (screen, app, pilot):
        field = screen.query_one("#dc-dest", Input)
        assert app.focused is field
        field.value = ""
        typed = str(tmp_path / "my copy/ctc")  # c and t are the wizard's keys elsewhere; space too
        await pilot.press(*typed)
        assert field.value == typed
        assert screen.phase == "setup" and screen.wizard is None and screen.busy is None
        await pilot.press("tab")  # the S3 field: single letters are text there too
        await pilot.press("c", "t", "space")
        assert screen.query_one("#dc-s3", Input).value == "ct "
        assert screen.phase == "setup" and screen.busy is None
        screen.query_one("#dc-s3", Input).value = ""
        await pilot.press("enter")
        await until(pilot, lambda: screen.phase == "select", timeout=30, what="inventory")
        assert screen.wizard.dest == (tmp_path / "my copy/ctc").resolve()


@aio
async def test_esc_asks_before_leaving_a_started_wizard(tmp_path):
    async with _wizard(tmp_path, _node(tmp_path, "a.log"), tmp_path / "dest") as (screen, app, pilot):
        await pilot.press("enter")
        await until(pilot, lambda: screen.phase == "select", timeout=30, what="inventory")
        await pilot.press("escape")
        await until(pilot, lambda: type(app.screen).__name__ == "LeaveWizardScreen", what="leave question")
        assert "not reached its verdict" in str(app.screen.query_one("#leave-text", Static).render())
        await pilot.press("escape")  # stay
        await until(pilot, lambda: app.screen is screen, what="back in the wizard")
        assert screen.phase == "select" and not screen.cancel.is_set()
        await pilot.press("escape")
        await until(pilot, lambda: type(app.screen).__name__ == "LeaveWizardScreen", what="leave question again")
        await pilot.press("y")
        await until(pilot, lambda: not screen.is_attached, what="wizard left")
        assert screen.cancel.is_set()


@aio
async def test_esc_before_the_start_leaves_at_once(tmp_path):
    async with _wizard(tmp_path, _node(tmp_path), tmp_path / "dest") as (screen, app, pilot):
        await pilot.press("escape")
        await until(pilot, lambda: not screen.is_attached, what="wizard left")
    assert not (tmp_path / "dest").exists()


@aio
async def test_the_wizard_leaves_nodedecks_env_out_and_says_each_fix_in_its_own_words(tmp_path):
    """Issue 39 item 1: nodedeck's own venv is its own class, left out; a link out of the roots is fixed by this
    screen's field and checkbox, named as they are here, not by command-line flags; the checkbox keeps the env."""
    import subprocess

    root = _node(tmp_path, "notes.md")
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(root / ".nodedeck/venv")], check=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "data.bin").write_bytes(b"d" * 100)
    (root / "far").symlink_to(tmp_path / "elsewhere" / "data.bin")
    async with _wizard(tmp_path, root, tmp_path / "dest") as (screen, app, pilot):
        await pilot.press("enter")
        await until(pilot, lambda: screen.phase == "select", timeout=30, what="inventory")
        table = screen.query_one("#dc-classes", DataTable)
        assert str(table.get_cell("nodedeck_env", "policy")) == "skip"
        assert "nodedeck's own environment" in _text(screen, "#dc-hint")
        await pilot.press("c")
        await until(pilot, lambda: screen.phase == "confirm", timeout=30, what="S3 step")
        await pilot.press("c")
        await until(pilot, lambda: screen.phase == "verdict", timeout=60, what="verdict")
        verdict = _text(screen, "#dc-verdict")
        assert "NOT SAFE" in verdict and "'far'" in verdict and ".nodedeck/venv" not in verdict.split("left out")[0]
        assert f"add {tmp_path / 'elsewhere' / 'data.bin'} to 'Other paths on the node to preserve'" in verdict
        assert "tick 'Accept symlinks that lead outside the roots'" in verdict and " --" not in verdict
        assert "left out: nodedeck's own environment" in verdict
    dest2 = tmp_path / "dest2"
    async with _wizard(tmp_path, root, dest2) as (screen, app, pilot):
        screen.query_one("#dc-own-env").value = True
        screen.query_one("#dc-roots", Input).value = str(tmp_path / "elsewhere" / "data.bin")
        await pilot.press("enter")
        await until(pilot, lambda: screen.phase == "select", timeout=30, what="inventory")
        assert screen.wizard.policies["nodedeck_env"] == "preserve"
        await pilot.press("c")
        await until(pilot, lambda: screen.phase == "confirm", timeout=30, what="S3 step")
        await pilot.press("c")
        await until(pilot, lambda: screen.phase == "verdict", timeout=60, what="verdict")
        verdict = _text(screen, "#dc-verdict")
        assert "NOT SAFE" in verdict and "venv/bin/python3" in verdict  # its own link out, now counted
    assert (dest2 / "files" / ".nodedeck" / "venv" / "pyvenv.cfg").exists()

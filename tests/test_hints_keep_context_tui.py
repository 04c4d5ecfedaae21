"""The dashboard's hints keep their context too (issue 39, item 2): opened as `nodedeck --work W --plan P
--node gpu1 --var out=...`, every command it shows (a refusal's, the skip confirmation's undo, the startup
warning's, the no-plan note's) names that workspace, plan, node and variable, and pasted acts on gpu1."""

from __future__ import annotations

import re
import shlex
import uuid
from pathlib import Path

import pytest

from cli.main import main
from ops.run.views import StageState
from tests.support.tmux_sessions import kill_plan_sessions
from tests.support.tui_screens import Seen, aio, screen_ready, until, wait_polled
from tui.app import NodedeckApp
from tui.live import LiveSource
from tui.screens.confirm import ConfirmFinishedScreen


@pytest.fixture
def dashboard_context(tmp_path, sshd, monkeypatch):
    from ops import hints, workspace

    name = f"ctxtui{uuid.uuid4().hex[:8]}"
    work = tmp_path / "ws"
    work.mkdir()
    (work / "nodedeck.toml").write_text('[workspace]\nnodes = "nodes.toml"\nstate = "state"\n')
    (work / "nodes.toml").write_text(
        f'[nodes.local]\nroot = "{tmp_path / "local-root"}"\n'
        f'[nodes.gpu1]\nssh = "{sshd.alias}"\nssh_config = "{sshd.ssh_config}"\nroot = "{tmp_path / "gpu1-root"}"\n'
        'connect_timeout = 5\n')
    plan = tmp_path / "p.toml"
    plan.write_text(f'''[plan]
name = "{name}"
[vars]
out = "{tmp_path / "default-out"}"
[[stage]]
id = "make"
command = "mkdir -p ${{out}} && echo made > ${{out}}/made.txt"
verify = [{{ kind = "file_exists", path = "${{out}}/made.txt" }}]
smoke = {{ command = "echo smoke", verify = [{{ kind = "log_contains", pattern = "smoke" }}] }}
[[stage]]
id = "trainer"
depends_on = ["make"]
command = "nodedeck-train --version"
''')
    out = str(tmp_path / "nd out")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    ws = workspace.resolve(str(work))
    assert ws is not None
    ws.activate()                      # as `nodedeck --work W` does before it opens the dashboard
    hints.given(plan=str(plan), node="gpu1", variables=[f"out={out}"])
    try:
        yield work, plan, out
    finally:
        hints.given()
        kill_plan_sessions(name)


def _commands(text: str) -> list[list[str]]:
    return [shlex.split(c)[1:] for c in re.findall(r"`(nodedeck [^`]+)`", text)]


@aio
async def test_the_dashboards_hints_name_its_workspace_plan_node_and_var(dashboard_context, tmp_path):
    work, plan, out = dashboard_context
    context = ["--work", str(work)]
    on_plan = ["--plan", str(plan), "--node", "gpu1", "--var", f"out={out}"]
    src = LiveSource(config_path=work / "nodes.toml", node="gpu1", plan_path=plan, plan_vars={"out": out}, timeout=5)
    app = NodedeckApp(src, refresh_s=0.25)
    seen = Seen()
    try:
        async with app.run_test(size=(140, 40), message_hook=seen) as pilot:
            await wait_polled(app, pilot, timeout=30)
            await until(pilot, lambda: "node setup gpu1" in seen.event_text(), 10, "the startup warning")
            [setup] = _commands(seen.event_text())
            assert setup == [*context, "node", "setup", "gpu1"]

            await pilot.press("l")    # refused: its smoke run has not verified; the hints say how
            await until(pilot, lambda: "refused" in seen.event_text(), 20, "the refusal")
            smoke, force = [c for c in _commands(seen.event_text()) if "stage" in c]
            assert smoke == [*context, "stage", "start", "make", *on_plan, "--smoke"]
            assert force == [*context, "stage", "start", "make", *on_plan, "--force"]
            assert main(smoke) == 0     # pasted, from another directory: it runs on gpu1
            await until(pilot, lambda: app.selected_stage().smoke_verified, 30, "the smoke run verified")
            await pilot.press("l")
            await until(pilot, lambda: app.selected_stage().state is StageState.COMPLETED, 30, "make completed")
            assert (Path(out) / "made.txt").exists() and not (tmp_path / "default-out").exists()

            await pilot.press("k")    # skipping a completed stage asks, naming the command that undoes it
            await until(pilot, lambda: screen_ready(app, ConfirmFinishedScreen), 10, "the confirmation")
            text = " ".join(str(w.render()) for w in app.screen.query("Static, Label"))
            [unskip] = _commands(text)
            assert unskip == [*context, "stage", "unskip", "make", *on_plan]
            await pilot.press("y")
            await until(pilot, lambda: app.selected_stage().state is StageState.SKIPPED, 20, "skipped")
            assert main(unskip) == 0
            await until(pilot, lambda: app.selected_stage().state is StageState.COMPLETED, 20, "unskipped")
    finally:
        src.close()


def test_the_no_plan_note_names_the_node_and_workspace(dashboard_context):
    from ops import hints

    work, _plan, _out = dashboard_context
    hints.given(node="gpu1")
    src = LiveSource(config_path=work / "nodes.toml", node="gpu1", timeout=5)
    try:
        note = src.poll_plan().note
    finally:
        src.close()
    assert _commands(note) == [["--work", str(work), "tui", "--node", "gpu1", "--plan", "FILE"]]

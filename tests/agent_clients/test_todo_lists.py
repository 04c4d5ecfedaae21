"""nodedeck shows the todo lists the real clients write: opencode 1.18, and Claude Code 2.1 with its Task tools and
with TodoWrite. A fake model drives each client twice into its own todo tool; after each update the list the client
stored (read straight from its store) is exactly what `todo agents --json`, a running `todo follow`, `todo audit`
and the dashboard's agent panel show, and no client reached anything beyond 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.agent_clients import ClientHome, pinned, stored_opencode, stored_tasks, stored_todowrite
from tests.support.fake_models import ScriptedModel, ToolCall
from tests.support.tmux_sessions import kill_plan_sessions
from tests.support.tui_screens import aio, until, wait_polled
from tui.app import NodedeckApp
from tui.live import LiveSource

pytestmark = pytest.mark.agent_clients

NODEDECK = str(Path(sys.executable).parent / "nodedeck")
WAIT_S = 60.0

PLAN = '''
[plan]
name = "{name}"
node = "local"
[[stage]]
id = "prep"
title = "Prepare the data"
command = "seq 5 > rows.txt"
verify = [{{ kind = "min_lines", path = "rows.txt", min = 5 }}]
todo = ["prepare the data"]
[[stage]]
id = "train"
title = "Train the drafter"
depends_on = ["prep"]
command = "echo trained"
verify = [{{ kind = "log_contains", pattern = "trained" }}]
todo = ["train the drafter"]
'''
PREP, TRAIN, BENCH, REPORT = ("Prepare the data", "Train the drafter", "Benchmark against the baseline",
                              "Write the report")
# what `todo audit` says of the two linked items (no stage of the plan ran)
PREP_IN_PROGRESS = ("contradicted", "claimed in progress, but stage prep never ran (ready to start)")
PREP_COMPLETED = ("contradicted", "stage prep never ran (ready to start)")
TRAIN_PENDING = ("agrees", "pending; stage train never ran (pending)")
TRAIN_IN_PROGRESS = ("contradicted", "claimed in progress, but stage train never ran (pending: waiting for prep)")
UNLINKED = ("unlinked", "no plan stage linked")
FIRST = [(PREP, "in_progress"), (TRAIN, "pending"), (BENCH, "pending")]     # what each client stores first
FIRST_CLAIMS = [PREP_IN_PROGRESS, TRAIN_PENDING, UNLINKED]
SECOND_CLAIMS = [PREP_COMPLETED, TRAIN_IN_PROGRESS, UNLINKED]                # a false completion: contradicted


@dataclass(frozen=True)
class Update:
    """One client run: the model's turns, the (content, status) the client should store, the audit's verdicts."""

    calls: list[ToolCall]
    stores: list[tuple[str, str]]
    claims: list[tuple[str, str]]


def _select(*tools: str) -> ToolCall:
    """Claude Code's todo tools are deferred: the model loads them first."""
    return ToolCall("ToolSearch", {"query": "select:" + ",".join(tools)})


OPENCODE = [
    Update([ToolCall("todowrite", {"todos": [
        {"id": "a", "content": PREP, "status": "in_progress", "priority": "high"},
        {"id": "b", "content": TRAIN, "status": "pending", "priority": "medium"},
        {"id": "c", "content": BENCH, "status": "pending", "priority": "low"}]})],
        FIRST, FIRST_CLAIMS),
    Update([ToolCall("todowrite", {"todos": [                     # words of opencode's own, stored as sent
        {"content": PREP, "status": "completed", "priority": "high"},
        {"content": TRAIN, "status": "in_progress", "priority": "urgent"},
        {"content": BENCH, "status": "blocked", "priority": "low"}]})],
        [(PREP, "completed"), (TRAIN, "in_progress"), (BENCH, "blocked")], SECOND_CLAIMS),
]
CLAUDE_TASKS = [
    Update([_select("TaskCreate", "TaskUpdate"),
            ToolCall("TaskCreate", {"subject": PREP, "description": "ShareGPT, 10K samples",
                                    "activeForm": "Preparing the data"}),
            ToolCall("TaskCreate", {"subject": TRAIN, "description": "EAGLE-3, TTT 7",
                                    "activeForm": "Training the drafter"}),
            ToolCall("TaskCreate", {"subject": BENCH, "description": "vLLM with and without the drafter"}),
            ToolCall("TaskUpdate", {"taskId": "1", "status": "in_progress"})],
           FIRST, FIRST_CLAIMS),
    Update([_select("TaskUpdate"),
            ToolCall("TaskUpdate", {"taskId": "1", "status": "completed"}),
            ToolCall("TaskUpdate", {"taskId": "2", "status": "in_progress", "addBlockedBy": ["1"]}),
            ToolCall("TaskUpdate", {"taskId": "3", "status": "deleted"}),
            ToolCall("TaskCreate", {"subject": REPORT, "description": "acceptance and speedup"})],
           [(PREP, "completed"), (TRAIN, "in_progress"), (REPORT, "pending")], SECOND_CLAIMS),
]
CLAUDE_TODOWRITE = [
    Update([_select("TodoWrite"), ToolCall("TodoWrite", {"todos": [
        {"content": PREP, "status": "in_progress", "activeForm": "Preparing the data"},
        {"content": TRAIN, "status": "pending", "activeForm": "Training the drafter"},
        {"content": BENCH, "status": "pending", "activeForm": "Benchmarking"}]})],
        FIRST, FIRST_CLAIMS),
    Update([_select("TodoWrite"), ToolCall("TodoWrite", {"todos": [
        {"content": PREP, "status": "completed", "activeForm": "Preparing the data"},
        {"content": TRAIN, "status": "in_progress", "activeForm": "Training the drafter"},
        {"content": REPORT, "status": "pending", "activeForm": "Writing the report"}]})],
        [(PREP, "completed"), (TRAIN, "in_progress"), (REPORT, "pending")], SECOND_CLAIMS),
]


class Follow:
    """A running `nodedeck todo follow --agent SPEC --json`: every list it printed, read by a thread."""

    def __init__(self, spec: str):
        self.proc = subprocess.Popen([NODEDECK, "todo", "follow", "--agent", spec, "--json", "--poll", "0.2"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.printed: queue.Queue[dict] = queue.Queue()
        self.errors: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                doc = json.loads(line)
            except ValueError:
                self.errors.append(line)                          # not a list: the follower failed
                continue
            if doc["error"] and doc["source"] is not None:        # not before the agent wrote its first list
                self.errors.append(doc["error"])
            self.printed.put(doc)

    def shows(self, items: list[dict]) -> None:
        """Wait for the follower to print exactly these items."""
        seen = []
        while True:
            try:
                doc = self.printed.get(timeout=WAIT_S)
            except queue.Empty:
                raise AssertionError(f"todo follow never printed {items}; it printed {seen[-3:]}") from None
            seen.append(doc["items"])
            if doc["items"] == items:
                return

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def _cli(*args: str) -> tuple[int, dict]:
    res = subprocess.run([NODEDECK, *args], capture_output=True, text=True, timeout=120, check=False)
    assert res.stdout.strip(), res.stderr
    return res.returncode, json.loads(res.stdout)


@dataclass
class World:
    """The fake model, the client's home, the plan its items link to; the dashboard following the agent."""

    model: ScriptedModel
    client: ClientHome
    cfg: Path
    plan: Path

    @asynccontextmanager
    async def watching(self, spec: str):
        """The dashboard and a `todo follow` process, both following the agent's newest list."""
        follow = Follow(spec)
        src = LiveSource(config_path=self.cfg, plan_path=self.plan, follow_agent=spec, timeout=5)
        app = NodedeckApp(src, refresh_s=0.2)
        try:
            async with app.run_test(size=(160, 50)) as pilot:
                await wait_polled(app, pilot, timeout=WAIT_S)
                yield Watch(self, spec, follow, app, pilot)
        finally:
            src.close()
            follow.stop()
        assert follow.errors == [] and self.model.outside == []


@dataclass
class Watch:
    world: World
    spec: str
    follow: Follow
    app: NodedeckApp
    pilot: object

    async def shows(self, session: str, stored: list[dict], update: Update) -> None:
        """What the client stored is what every face of nodedeck shows."""
        assert [(i["content"], i["status"]) for i in stored] == update.stores        # the client did as driven
        _, agents = await asyncio.to_thread(_cli, "todo", "agents", "--json", "--items")
        [found] = [a for a in agents["lists"] if a["session"] == session]
        assert found["items"] == stored and found["error"] is None
        assert found["project"] == os.path.realpath(self.world.client.project)

        await asyncio.to_thread(self.follow.shows, stored)

        code, report = await asyncio.to_thread(_cli, "--config", str(self.world.cfg), "todo", "audit", "--plan",
                                               str(self.world.plan), "--agent", self.spec, "--json")
        assert code == 1 and report["source"]["session"] == session
        assert [{k: i[k] for k in stored[0]} for i in report["items"]] == stored
        assert [(i["claim"], i["reason"]) for i in report["items"]] == update.claims

        panel = self.app.dash.plan
        await until(self.pilot, lambda: panel.view.agent is not None
                    and [a.item.to_json() for a in panel.view.agent.audits] == stored, WAIT_S, "the panel's list")
        rows = [str(w.render()) for w in panel.query(".agent-item")]
        assert [r.split("  ")[0][2:] for r in rows] == [i["content"] for i in stored]
        assert [a.claim.value for a in panel.view.agent.audits] == [c for c, _ in update.claims]


@pytest.fixture
def world(tmp_path, monkeypatch):
    with ScriptedModel() as model:
        client = ClientHome(tmp_path / "agent", model)
        client.prepare()
        for key in ("HOME", "XDG_DATA_HOME"):                     # nodedeck reads where the clients wrote
            monkeypatch.setenv(key, client.env()[key])
        monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
        name = f"agt{uuid.uuid4().hex[:8]}"
        cfg = tmp_path / "nodes.toml"
        cfg.write_text(f'[nodes.local]\nroot = "{tmp_path / "work"}"\n')
        plan = tmp_path / "p.toml"
        plan.write_text(PLAN.format(name=name))
        yield World(model, client, cfg, plan)
        kill_plan_sessions(name)


def test_the_clients_are_the_pinned_ones(clients):
    for package, version in pinned().items():
        assert json.loads((clients / "node_modules" / package / "package.json").read_text())["version"] == version


@aio
async def test_opencode_lists_are_shown_as_opencode_stored_them(clients, world):
    async with world.watching("opencode") as watch:
        session = None
        for update in OPENCODE:
            await asyncio.to_thread(world.client.opencode, clients, update.calls, session)
            [(session, stored)] = stored_opencode(world.client.opencode_db).items()
            await watch.shows(session, stored, update)


@aio
async def test_claude_code_task_lists_are_shown_as_claude_code_stored_them(clients, world):
    session = str(uuid.uuid4())
    async with world.watching("claude") as watch:
        for n, update in enumerate(CLAUDE_TASKS):
            await asyncio.to_thread(world.client.claude, clients, update.calls, session, resume=n > 0)
            stored = stored_tasks(world.client.claude_config / "tasks" / session)
            await watch.shows(session, stored, update)
        assert [(i["id"], i["blocks"], i["blocked_by"]) for i in stored] == [
            ("1", ["2"], []), ("2", [], ["1"]), ("4", [], [])]     # the client's own graph, and task 3 deleted
        rows = [str(w.render()) for w in watch.app.dash.plan.query(".agent-item")]
        assert "blocks #2" in rows[0] and "blocked by #1 · plan: stage train after prep" in rows[1]


@aio
async def test_claude_code_todowrite_lists_are_shown_as_claude_code_stored_them(clients, world):
    session = str(uuid.uuid4())
    async with world.watching("claude") as watch:
        for n, update in enumerate(CLAUDE_TODOWRITE):
            await asyncio.to_thread(world.client.claude, clients, update.calls, session, resume=n > 0, tasks=False)
            [transcript] = (world.client.claude_config / "projects").glob(f"*/{session}.jsonl")
            await watch.shows(session, stored_todowrite(transcript), update)
        config = world.client.claude_config
        assert not (config / "tasks").exists() and not (config / "todos").exists()   # the transcript only

"""The real coding agents, run against the fake model in a home of their own (the agent-client tier).

`make test` installs the pinned clients from npm into `.agents-clients/` (the Makefile's AGENT_CLIENTS line);
`$NODEDECK_AGENT_CLIENTS` names another such directory. Each client runs with HOME and every XDG directory in the
test's temporary directory, the fake model as its only provider, the fake model as its HTTP(S) proxy (so nothing
leaves 127.0.0.1 unseen) and every update, telemetry and plugin download turned off:
- opencode: `$XDG_CONFIG_HOME/opencode/opencode.json` names the provider `fake` (`@ai-sdk/openai-compatible`,
  bundled in opencode) at the fake model's URL; npm is offline for its background plugin install.
- Claude Code: `ANTHROPIC_BASE_URL` and a dummy key; its todo tools are offered to the default model only with
  `CLAUDE_CODE_ENABLE_TODO_TOOLS=true`; `CLAUDE_CODE_ENABLE_TASKS=false` gives TodoWrite instead of the Task tools.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.fake_models import ScriptedModel, ToolCall

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 180


def pinned() -> dict[str, str]:
    """The clients the Makefile installs: npm package -> version (its one `AGENT_CLIENTS :=` line)."""
    [line] = [ln for ln in (REPO / "Makefile").read_text().splitlines() if ln.startswith("AGENT_CLIENTS ")]
    return dict(spec.rsplit("@", 1) for spec in line.split(":=", 1)[1].split())


def clients_dir() -> Path | None:
    """The directory the clients are installed in (`node_modules/.bin/{opencode,claude}`), or None."""
    d = Path(os.environ.get("NODEDECK_AGENT_CLIENTS") or REPO / ".agents-clients")
    bins = d / "node_modules" / ".bin"
    return d if (bins / "opencode").exists() and (bins / "claude").exists() else None


@dataclass(frozen=True)
class ClientHome:
    """Where a client runs: its HOME and XDG dirs under `root`, the project directory it works in."""

    root: Path
    model: ScriptedModel

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def project(self) -> Path:
        return self.root / "project"

    @property
    def claude_config(self) -> Path:
        return self.home / ".claude"

    @property
    def opencode_db(self) -> Path:
        return self.root / "xdg-data" / "opencode" / "opencode.db"

    def env(self) -> dict[str, str]:
        """The environment of the clients, and of nodedeck reading what they wrote."""
        quiet = {
            # opencode: no update check, no models.dev catalogue, no sharing, no LSP or plugin downloads
            "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "npm_config_offline": "true",
            # Claude Code: no telemetry, error reports, update checks or other nonessential traffic
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_ENABLE_TODO_TOOLS": "true",
            "ANTHROPIC_BASE_URL": self.model.url, "ANTHROPIC_API_KEY": "sk-ant-fake-key",
        }
        proxy = {k: self.model.url for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")}
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(self.home),
                "TMPDIR": str(self.root / "tmp"), "XDG_CONFIG_HOME": str(self.root / "xdg-config"),
                "XDG_DATA_HOME": str(self.root / "xdg-data"), "XDG_STATE_HOME": str(self.root / "xdg-state"),
                "XDG_CACHE_HOME": str(self.root / "xdg-cache"), "NO_PROXY": "127.0.0.1,localhost",
                "no_proxy": "127.0.0.1,localhost", **proxy, **quiet}

    def prepare(self) -> None:
        for d in (self.home, self.project, self.root / "tmp"):
            d.mkdir(parents=True, exist_ok=True)
        config = self.root / "xdg-config" / "opencode" / "opencode.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(json.dumps({
            "$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled",
            "model": "fake/scripted", "small_model": "fake/scripted",
            "provider": {"fake": {"npm": "@ai-sdk/openai-compatible", "name": "Fake",
                                  "options": {"baseURL": f"{self.model.url}/v1", "apiKey": "fake-key"},
                                  "models": {"scripted": {"name": "Scripted", "tool_call": True}}}}}))

    def _run(self, argv: list[str], calls: list[ToolCall], **extra: str) -> None:
        self.model.play(calls)
        res = subprocess.run(argv, cwd=self.project, env={**self.env(), **extra}, capture_output=True, text=True,
                             timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
        assert res.returncode == 0, f"{argv[0]} exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        assert not self.model.script, f"{argv[0]} stopped before the model's turns ran out: {list(self.model.script)}"

    def opencode(self, clients: Path, calls: list[ToolCall], session: str | None = None) -> None:
        """`opencode run` (continuing `session`) until the model's turns are spent."""
        argv = [str(clients / "node_modules" / ".bin" / "opencode"), "run", "--pure", "--title", "agents tier",
                "-m", "fake/scripted"]
        self._run(argv + (["--session", session] if session else []) + ["Plan the drafter's training."], calls)

    def claude(self, clients: Path, calls: list[ToolCall], session: str, *, resume: bool,
               tasks: bool = True) -> None:
        """`claude -p` as session `session` (resumed: its second turn); TodoWrite instead of the Task tools
        when not `tasks`."""
        argv = [str(clients / "node_modules" / ".bin" / "claude"), "-p", "--resume" if resume else "--session-id",
                session, "Plan the drafter's training."]
        self._run(argv, calls, **({} if tasks else {"CLAUDE_CODE_ENABLE_TASKS": "false"}))


# -- what each client stored, read straight from its store, as nodedeck's item JSON should show it ----------------
def _shown(n: int, content: str, status: str, *, id: str | None = None, priority: str | None = None,
           active_form: str | None = None, description: str | None = None, blocks=(), blocked_by=()) -> dict:
    return {"position": n, "id": id, "content": content, "status": status, "priority": priority,
            "active_form": active_form, "description": description, "blocks": list(blocks),
            "blocked_by": list(blocked_by)}


def stored_opencode(db: Path) -> dict[str, list[dict]]:
    """Session id -> its rows of opencode's `todo` table, in position order (read-only: opencode may be writing)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT session_id, content, status, priority FROM todo ORDER BY session_id, position")
        out: dict[str, list[dict]] = {}
        for sid, content, status, priority in rows:
            out.setdefault(sid, []).append(_shown(len(out.get(sid, ())) + 1, content, status, priority=priority))
        return out
    finally:
        con.close()


def stored_tasks(list_dir: Path) -> list[dict]:
    """The Task tools' files of one list, in id order."""
    docs = [json.loads(p.read_text()) for p in sorted(list_dir.glob("*.json"), key=lambda p: int(p.stem))]
    return [_shown(n, d["subject"], d["status"], id=d["id"], active_form=d.get("activeForm"),
                   description=d["description"], blocks=d["blocks"], blocked_by=d["blockedBy"])
            for n, d in enumerate(docs, 1)]


def stored_todowrite(transcript: Path) -> list[dict]:
    """The list the session's last TodoWrite left: the newest `toolUseResult.newTodos` of its transcript."""
    todos: list[dict] = []
    for line in transcript.read_text().splitlines():
        rec = json.loads(line)
        if isinstance(rec.get("toolUseResult"), dict) and "newTodos" in rec["toolUseResult"]:
            todos = rec["toolUseResult"]["newTodos"]
    return [_shown(n, t["content"], t["status"], active_form=t["activeForm"]) for n, t in enumerate(todos, 1)]

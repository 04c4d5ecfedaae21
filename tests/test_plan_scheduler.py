"""The scheduler with real tmux, a real SQLite store and LocalHost: what it claims is what happened."""

from __future__ import annotations

import subprocess
import time
import uuid
from dataclasses import dataclass

import pytest

from ops.errors import UserError
from ops.hosts.local import LocalHost
from ops.node_handle import NodeHandles
from ops.plan.parse import parse_plan
from ops.run.scheduler import Scheduler
from ops.run.views import StageState as S
from ops.state import StateStore
from ops.tmux import TmuxRunner, tmux_name
from tests.support.sshd import free_port
from tests.support.tmux_sessions import TMUX, kill_plan_sessions

POLL = 0.1


@dataclass
class Node:
    """What the scheduler asks of a NodeHandle, over a state file of the test's own."""

    name: str
    root: str
    max_parallel: int
    host: object
    store: object
    runner: object
    node: object = None


class Env:
    """A plan on the local node with a state file that survives scheduler objects."""

    def __init__(self, tmp_path):
        self.root = tmp_path / "work"
        self.root.mkdir()
        self.db = tmp_path / "state.sqlite"
        self.plan_name = f"t{uuid.uuid4().hex[:8]}"
        self.plans = []

    def node(self, max_parallel: int = 4) -> Node:
        host = LocalHost()
        store = StateStore(self.db)
        return Node("local", str(self.root), max_parallel, host, store,
                    TmuxRunner(host, store, str(self.root / ".runs")))

    def plan(self, body: str, *, header: str = ""):
        plan = parse_plan(f'[plan]\nname = "{self.plan_name}"\n{header}\n{body}', f"{self.plan_name}.toml")
        self.plans.append(plan)
        return plan

    def scheduler(self, plan, *, max_parallel: int = 4, **kw) -> Scheduler:
        node = self.node(max_parallel)
        events = []
        s = Scheduler(plan, NodeHandles.of(node), listener=events.append, **kw)
        s.events = events
        return s

    def cleanup(self) -> None:
        for plan in self.plans:
            kill_plan_sessions(plan.name)


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    yield e
    e.cleanup()


def states(res) -> dict[str, S]:
    return {v.id: v.state for v in res.views}


def run_until(s: Scheduler, pred, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    history = []
    while True:
        res = s.tick()
        history.append(res)
        if pred(res):
            return res, history
        assert time.monotonic() < deadline, f"timed out; last states {states(res)}"
        time.sleep(POLL)


def test_dag_order_and_parallel_limit(env):
    # three independent stages with a limit of 2, and one that depends on all three
    plan = env.plan('''
[[stage]]
id = "a"
command = "until [ -e go ]; do sleep 0.02; done; echo a > a.out"
outputs = ["a.out"]
[[stage]]
id = "b"
command = "until [ -e go ]; do sleep 0.02; done; echo b > b.out"
outputs = ["b.out"]
[[stage]]
id = "c"
command = "until [ -e go ]; do sleep 0.02; done; echo c > c.out"
outputs = ["c.out"]
[[stage]]
id = "d"
depends_on = ["a", "b", "c"]
command = "cat a.out b.out c.out > d.out"
outputs = ["d.out"]
''')
    s = env.scheduler(plan, max_parallel=2, auto=True)

    def done_once_two_ran(r):   # the jobs wait until two of them were seen running together, however slow
        if sum(1 for st in states(r).values() if st is S.RUNNING) == 2:
            (env.root / "go").touch()
        return r.done

    res, history = run_until(s, done_once_two_ran)
    assert res.ok and all(v.state is S.COMPLETED for v in res.views)
    assert (env.root / "d.out").read_text() == "a\nb\nc\n"
    # at most two stages were ever alive together, and d only after a, b, c completed
    store = s.ctx.handle(plan.stages[0]).store
    runs = {r.stage.split("/")[1]: r for r in store.tmux_session_runs() if r.stage.startswith(plan.name)}
    assert sorted(runs) == ["a", "b", "c", "d"]
    for t in [r.started_at for r in runs.values()]:
        alive = [r for r in runs.values() if r.started_at <= t < (r.ended_at or 1e18)]
        assert len(alive) <= 2
    assert runs["d"].started_at >= max(runs[x].ended_at for x in "abc")
    assert max(sum(1 for st in states(h).values() if st is S.RUNNING) for h in history) <= 2
    assert all(r.attempt == 1 for r in runs.values())


def test_started_then_died_is_failed_never_running_or_completed(env):
    plan = env.plan('''
[[stage]]
id = "liar"
command = "echo started; echo 'The server is fired up'; kill -9 $$"
verify = [{ kind = "log_contains", pattern = "started" }]
[[stage]]
id = "after"
depends_on = ["liar"]
command = "true"
''')
    s = env.scheduler(plan, auto=True)
    res, history = run_until(s, lambda r: r.done)
    v = {x.id: x for x in res.views}
    assert v["liar"].state is S.FAILED and v["liar"].exit_code == 137
    assert v["after"].state is S.BLOCKED and v["after"].detail == "dependency liar failed"
    assert not res.ok
    assert all(states(h)["liar"] is not S.COMPLETED for h in history)


def test_exit_zero_with_missing_output_fails_naming_the_check(env):
    plan = env.plan('''
[[stage]]
id = "forgetful"
command = "echo done"
outputs = ["result.jsonl"]
verify = [{ kind = "log_contains", pattern = "done" }]
''')
    s = env.scheduler(plan, auto=True)
    res, _ = run_until(s, lambda r: r.done)
    v = res.views[0]
    assert v.state is S.FAILED and v.exit_code == 0
    assert v.detail == f"file_exists {env.root}/result.jsonl: missing ✗"
    assert [c.ok for c in v.checks] == [False, True]
    # the results are in the store, and a new scheduler shows them without running anything
    again = env.scheduler(plan).tick().views[0]
    assert again.state is S.FAILED and [c.text for c in again.checks] == [c.text for c in v.checks]


def test_restart_of_nodedeck_adopts_a_running_stage(env):
    plan = env.plan('''
[[stage]]
id = "long"
command = "sleep 1.5; touch long.done"
outputs = ["long.done"]
''')
    first = env.scheduler(plan, auto=True)
    res, _ = run_until(first, lambda r: states(r)["long"] is S.RUNNING)
    pid = res.views[0].detail
    first.ctx.handle(plan.stages[0]).store.close()
    del first
    # a new nodedeck: new store and scheduler objects on the same state file
    second = env.scheduler(plan, auto=True)
    res = second.tick()
    assert states(res)["long"] is S.RUNNING and res.views[0].detail.split(",")[0] == pid.split(",")[0]
    assert not [e for e in second.events if e.kind == "launch"]
    res, _ = run_until(second, lambda r: r.done)
    assert states(res)["long"] is S.COMPLETED
    runs = second.ctx.handle(plan.stages[0]).store.runs_for_stage(f"{plan.name}/long")
    assert len(runs) == 1


def test_smoke_gate(env):
    plan = env.plan('''
[[stage]]
id = "prep"
command = "printf 'x\\n%.0s' $(seq 1 ${n}) > out.jsonl"
outputs = ["out.jsonl"]
verify = [{ kind = "min_lines", path = "out.jsonl", min = 100 }]
[stage.smoke]
command = "printf 'x\\n' > out.jsonl; echo smoke-ok"
verify = [{ kind = "log_contains", pattern = "smoke-ok" }]
''', header='[vars]\nn = "100"')
    s = env.scheduler(plan)
    with pytest.raises(UserError) as ei:
        s.start("prep")
    msg = str(ei.value)
    assert "\n" not in msg and "stage 'prep'" in msg and "--smoke" in msg and "--force" in msg
    v = s.start("prep", smoke=True)
    assert v.smoke
    res, _ = run_until(s, lambda r: r.views[0].smoke_verified)
    assert res.views[0].state is S.READY and "smoke verified" in res.views[0].detail
    s.start("prep")
    res, _ = run_until(s, lambda r: r.views[0].state.terminal)
    assert res.views[0].state is S.COMPLETED and not res.views[0].smoke
    assert [c.text.split(":")[-1].strip() for c in res.views[0].checks] == ["file, 200 B ✓", "100 lines ✓"]


def test_smoke_force_and_headless_runs_smoke_then_full(env):
    plan = env.plan('''
[[stage]]
id = "a"
command = "echo full"
smoke_args = "&& echo smoke"
verify = [{ kind = "log_contains", pattern = "full" }]
''')
    s = env.scheduler(plan)
    s.start("a", force=True)
    res, _ = run_until(s, lambda r: r.views[0].state.terminal)
    assert res.views[0].state is S.COMPLETED and not res.views[0].smoke_verified
    # headless: smoke first, verified, then the full run, automatically
    plan2 = env.plan('''
[[stage]]
id = "b"
command = "echo full"
smoke_args = "&& echo smoke"
verify = [{ kind = "log_contains", pattern = "full" }]
''')
    s2 = env.scheduler(plan2, auto=True)
    res, _ = run_until(s2, lambda r: r.done)
    assert res.ok
    launches = [e.message for e in s2.events if e.kind == "launch"]
    assert len(launches) == 2 and "smoke run" in launches[0] and "full run" in launches[1]
    assert any(e.kind == "smoke" for e in s2.events)


def test_retries_count_attempts_and_timeout_stops(env):
    plan = env.plan('''
[[stage]]
id = "flaky"
command = "n=$(cat n 2>/dev/null || echo 0); echo $((n+1)) > n; [ $n -ge 1 ]"
retries = 2
[[stage]]
id = "slow"
command = "sleep 30"
timeout = 0.5
''')
    s = env.scheduler(plan, auto=True, stop_grace=2.0)
    res, _ = run_until(s, lambda r: r.done)
    v = {x.id: x for x in res.views}
    assert v["flaky"].state is S.COMPLETED and v["flaky"].attempt == 2
    assert v["slow"].state is S.FAILED and v["slow"].detail.startswith("timed out after 0s")
    runs = s.ctx.handle(plan.stages[0]).store.runs_for_stage(f"{plan.name}/slow")
    assert len(runs) == 1 and runs[0].stopped_at is not None
    assert subprocess.run([*TMUX, "has-session", "-t", f"={tmux_name(runs[0].tmux_session)}"],
                          capture_output=True).returncode != 0


def test_skip_satisfies_dependents_and_stop_is_recorded(env):
    plan = env.plan('''
[[stage]]
id = "a"
command = "sleep 30"
[[stage]]
id = "b"
command = "exit 1"
[[stage]]
id = "c"
depends_on = ["b"]
command = "true"
''')
    s = env.scheduler(plan)
    s.start("a")
    with pytest.raises(UserError, match="already running"):
        s.start("a")
    with pytest.raises(UserError, match="stop it before skipping"):
        s.skip("a")
    v = s.stop("a", grace=2.0)
    assert v.state is S.FAILED and v.detail == "stopped by user"
    with pytest.raises(UserError, match="waits for b"):
        s.start("c")
    s.skip("b")
    res = s.tick()
    assert states(res) == {"a": S.FAILED, "b": S.SKIPPED, "c": S.READY}
    s.start("c")
    res, _ = run_until(s, lambda r: r.views[2].state.terminal)
    assert states(res)["c"] is S.COMPLETED


def test_server_is_completed_while_healthy(env):
    port = free_port()
    plan = env.plan(f'''
[[stage]]
id = "srv"
kind = "server"
command = "sleep 0.3; echo 'server ready'; exec python3 -m http.server {port} --bind 127.0.0.1"
verify = [
  {{ kind = "http_ok", url = "http://127.0.0.1:{port}/", timeout = 2 }},
  {{ kind = "log_contains", pattern = "server ready" }},
]
[[stage]]
id = "client"
depends_on = ["srv"]
command = "curl -sf http://127.0.0.1:{port}/ > page.html"
outputs = ["page.html"]
''')
    s = env.scheduler(plan, auto=True, server_check_interval=0.1)
    res, history = run_until(s, lambda r: r.done)
    v = {x.id: x for x in res.views}
    assert v["srv"].state is S.COMPLETED and v["client"].state is S.COMPLETED and res.ok
    assert all(c.ok for c in v["srv"].checks) and len(v["srv"].checks) == 3   # process_alive + the two
    assert any(states(h)["srv"] in (S.VERIFYING, S.PENDING) for h in history)
    v = s.stop("srv", grace=2.0)
    assert v.state is S.COMPLETED and "stopped by user" in v.detail


def test_launch_error_is_failed_not_relaunched(env):
    plan = env.plan('''
[[stage]]
id = "up"
upload = ["missing-file.txt:in/missing-file.txt"]
command = "true"
''')
    s = env.scheduler(plan, auto=True)
    res = s.run(poll=POLL)
    assert res.done and res.views[0].state is S.FAILED and "no such local file" in res.views[0].detail
    assert s.tick().views[0].state is S.FAILED
    assert s.ctx.handle(plan.stages[0]).store.latest_run(f"{plan.name}/up") is None

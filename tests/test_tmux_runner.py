"""TmuxRunner against real tmux, real /proc and real SQLite, on LocalHost and over a real sshd."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from ops.errors import HostError, UserError
from ops.hosts.local import LocalHost
from ops.state import StateStore
from ops.tmux import AlreadyRunning, TmuxRunner, tmux_name
from ops.tmux.sessions import progress_path
from tests.support.tmux_sessions import TMUX


def proc_start(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat, read here (the node is this machine)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2 :].split()[19])


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for(pred, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    pause = 0.01
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def tmux_has(name: str) -> bool:
    return subprocess.run([*TMUX, "has-session", "-t", f"={name}"], capture_output=True).returncode == 0


@pytest.fixture
def names():
    """Unique session names; their tmux sessions are killed by exact name afterwards."""
    made: list[str] = []

    def new(prefix="t"):
        made.append(f"{prefix}-{uuid.uuid4().hex[:10]}")
        return made[-1]

    yield new
    for n in made:
        subprocess.run([*TMUX, "kill-session", "-t", f"={tmux_name(n)}"], capture_output=True)


@pytest.fixture(params=["local", "ssh"])
def host(request):
    if request.param == "local":
        h = LocalHost()
    else:
        from ops.hosts.ssh import SSHHost

        server = request.getfixturevalue("sshd")
        h = SSHHost("testnode", "testnode", ssh_config=server.ssh_config)
    yield h
    h.close()


@pytest.fixture
def make_runner(tmp_path):
    def make(h=None):
        store = StateStore(tmp_path / "state" / "node.sqlite")
        return TmuxRunner(h or LocalHost(), store, str(tmp_path / "node root" / ".nodedeck" / "runs"))

    return make


@pytest.fixture
def runner(make_runner):
    return make_runner()


@pytest.fixture
def fake_sglang(tmp_path):
    """(argv, PYTHONPATH): `.../python3 -m sglang.launch_server --model-path X` that just sleeps.

    python3 is a symlink to the real interpreter (a pyenv shim would exec it under another name),
    so every process started with this argv shows exactly the same command line.
    """
    pkg = tmp_path / "pkgs" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text("import time\ntime.sleep(120)\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").symlink_to(os.path.realpath(sys.executable))
    return [str(tmp_path / "bin" / "python3"), "-m", "sglang.launch_server", "--model-path", "X"], str(pkg.parent)


# -- the required safety tests ---------------------------------------------------


def test_stop_kills_only_the_stage_never_lookalike_decoys(host, make_runner, names, fake_sglang):
    runner = make_runner(host)
    server_argv, pythonpath = fake_sglang
    env = {**os.environ, "PYTHONPATH": pythonpath}
    decoys = [subprocess.Popen(server_argv, env=env, start_new_session=True) for _ in range(2)]
    foreign = f"user-{uuid.uuid4().hex[:10]}"  # a tmux session nodedeck did not create, running the same
    subprocess.run([*TMUX, "new-session", "-d", "-s", foreign, "-e", f"PYTHONPATH={pythonpath}",
                    *server_argv], check=True)
    try:
        name = names()
        rec = runner.start(name, server_argv, env={"PYTHONPATH": pythonpath})
        assert rec.state == "running" and alive(rec.pid)
        assert rec.proc_start == proc_start(rec.pid) and rec.pgid == rec.pid

        def lookalikes():
            return [p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == server_argv]

        wait_for(lambda: len(lookalikes()) == 4, what="four processes with the server's exact argv")
        stage_pid = next(p for p in lookalikes() if psutil.Process(p).ppid() == rec.pid)
        foreign_pid = next(p for p in lookalikes() if p not in (stage_pid, *[d.pid for d in decoys]))

        res = runner.stop(name, grace=5)
        assert res.stopped and res.outcome == "terminated" and res.exit_code == 143
        assert not alive(rec.pid) and not alive(stage_pid)
        assert all(d.poll() is None for d in decoys), "a decoy was killed"
        assert alive(foreign_pid) and tmux_has(foreign)
        assert not tmux_has(tmux_name(name))
        st = runner.status(name)
        assert (st.state, st.exit_code) == ("exited", 143)
        assert runner.store.latest_tmux_session_run(name).stopped_at is not None
    finally:
        for d in decoys:
            d.kill()
            d.wait()
        subprocess.run([*TMUX, "kill-session", "-t", f"={foreign}"], capture_output=True)


def test_stop_refuses_when_recorded_start_time_differs(runner, names):
    name = names()
    rec = runner.start(name, ["sleep", "60"])
    runner.store.update_run(rec.id, proc_start=rec.proc_start + 1)  # as if the PID now named another process
    res = runner.stop(name, grace=1)
    assert not res.stopped and res.outcome == "gone"
    assert "nothing killed" in res.message
    assert alive(rec.pid) and tmux_has(tmux_name(name))
    assert runner.store.latest_tmux_session_run(name).state == "lost"


def test_job_that_prints_started_then_fails_is_exited_not_running(host, make_runner, names):
    runner = make_runner(host)
    name = names()
    rec = runner.start(name, "echo started; exit 1")
    # Seen alive for an instant, or already gone with its status: never running without a live PID.
    assert (rec.state, rec.exit_code) in (("running", None), ("exited", 1))
    wait_for(lambda: runner.status(name).state != "running", what="exit")
    st = runner.status(name)
    assert (st.state, st.exit_code, st.running) == ("exited", 1, False)
    assert runner.tail(name) == "started\n"

    slow = names()
    rec = runner.start(slow, "echo started; sleep 0.3; exit 1")
    assert rec.state in ("running", "exited")
    wait_for(lambda: runner.status(slow).state == "exited", what="exit")
    assert runner.status(slow).exit_code == 1
    assert runner.store.latest_tmux_session_run(slow).exit_code == 1


@pytest.mark.parametrize("code", [0, 7])
def test_exit_code_is_captured(runner, names, code):
    name = names()
    runner.start(name, ["bash", "-c", f"sleep 0.2; exit {code}"])
    wait_for(lambda: runner.status(name).state == "exited", what="exit")
    assert runner.status(name).exit_code == code
    assert [e.kind for e in runner.store.events()][-1] == "run.exited"


def test_restart_reconciles_without_relaunching(host, make_runner, names, tmp_path):
    first = make_runner(host)
    live, done, vanished, killed = names(), names(), names(), names()
    rec = first.start(live, ["sleep", "60"])
    go = tmp_path / "go"
    done_rec = first.start(done, f"while [ ! -e {go} ]; do sleep 0.02; done; exit 4")
    gone = first.start(vanished, ["sleep", "60"])
    shot = first.start(killed, ["sleep", "60"])
    first.store.close()

    # While nodedeck is down: one job is SIGKILLed (its dead pane stays), one vanishes with its session.
    os.killpg(shot.pgid, signal.SIGKILL)
    os.killpg(gone.pgid, signal.SIGKILL)
    subprocess.run([*TMUX, "kill-session", "-t", f"={tmux_name(vanished)}"], check=True)
    wait_for(lambda: not alive(gone.pid) and not alive(shot.pid), what="jobs to die")
    assert not os.path.exists(gone.exit_path)
    go.touch()
    wait_for(lambda: os.path.exists(done_rec.exit_path), what="second job to finish")

    again = make_runner(host)
    statuses = {s.tmux_session: s for s in again.reconcile()}
    assert statuses[live].state == "running" and statuses[live].pid == rec.pid
    assert (statuses[done].state, statuses[done].exit_code) == ("exited", 4)
    assert statuses[vanished].state == "lost"
    # tmux reports the signal once it has reaped the pane (it may lag): never "running" either way.
    shot_status = statuses[killed]
    assert (shot_status.state, shot_status.exit_code, shot_status.detail) in (
        ("exited", 137, "killed by signal 9"), ("lost", None, "ended without an exit status"))
    assert [r.tmux_session for r in again.store.active_runs()] == [live]
    with pytest.raises(AlreadyRunning):
        again.start(live, ["sleep", "60"])
    assert alive(rec.pid) and again.status(live).pid == rec.pid
    assert len(again.store.runs_for_stage(live)) == 0 and again.store.latest_tmux_session_run(live).id == rec.id


def test_env_and_cwd_with_spaces_and_quotes(host, make_runner, names, tmp_path):
    runner = make_runner(host)
    cwd = tmp_path / "dir with 'single' and \"double\" quotes; $x"
    cwd.mkdir()
    value = "a b 'c' \"d\" $HOME `x` ; & |"
    name = names()
    log = str(tmp_path / "logs dir" / "my log.txt")
    runner.start(name, 'pwd; printf "%s|%s\\n" "$MY_VAR" "$1"', cwd=str(cwd), env={"MY_VAR": value}, log_path=log)
    wait_for(lambda: runner.status(name).state == "exited", what="exit")
    assert runner.status(name).exit_code == 0
    assert Path(log).read_text() == f"{cwd}\n{value}|\n"

    argv_name = names()
    runner.start(argv_name, ["printf", "[%s]\\n", "two words", "it's", '"q"', ";", "$HOME"], cwd=str(cwd))
    wait_for(lambda: runner.status(argv_name).state == "exited", what="exit")
    assert runner.tail(argv_name) == "[two words]\n[it's]\n[\"q\"]\n[;]\n[$HOME]\n"


def test_sigterm_ignoring_job_is_killed_after_grace(runner, names):
    name = names()
    rec = runner.start(name, "trap '' TERM; echo ready; while :; do sleep 0.05; done")
    t0 = time.monotonic()
    res = runner.stop(name, grace=0.5)
    assert res.outcome == "killed" and res.exit_code == 137
    assert time.monotonic() - t0 >= 0.5
    assert not alive(rec.pid)
    st = runner.status(name)
    assert (st.state, st.exit_code) == ("exited", 137)
    assert runner.stop(name).outcome == "not_running"


# -- starting -----------------------------------------------------------------------


def test_start_refuses_live_session_and_cleans_dead_one(runner, names):
    name = names()
    runner.start(name, "exit 0")
    wait_for(lambda: runner.status(name).state == "exited", what="exit")
    assert tmux_has(tmux_name(name))  # remain-on-exit keeps the dead pane
    again = runner.start(name, ["sleep", "60"])
    assert again.state == "running" and again.attempt == 2
    with pytest.raises(AlreadyRunning, match=name):
        runner.start(name, ["sleep", "60"])
    assert alive(again.pid)


def test_live_tmux_session_unknown_to_the_store_blocks_start(runner, names, make_runner, tmp_path):
    name = names()
    other = TmuxRunner(LocalHost(), StateStore(tmp_path / "other.sqlite"), runner.run_dir)
    rec = other.start(name, ["sleep", "60"])
    with pytest.raises(AlreadyRunning):
        runner.start(name, ["sleep", "60"])
    assert runner.status(name).pid == rec.pid and runner.status(name).running


@pytest.mark.parametrize("bad", ["", "a.b", "a:b", "-x", "_x", "a b", "x" * 64, "é"])
def test_bad_session_names_are_refused(runner, bad):
    with pytest.raises(UserError, match="session name"):
        runner.start(bad, ["true"])


def test_progress_path_is_the_tmux_session_in_the_run_dir(runner):
    assert progress_path("/w/runs/", "nd-p-train") == "/w/runs/nd-p-train.progress.jsonl"
    assert runner.progress_path("train").endswith("/nd-train.progress.jsonl")


def test_bad_paths_env_and_command_are_refused(runner, names):
    with pytest.raises(UserError, match="absolute"):
        runner.start(names(), ["true"], cwd="relative/dir")
    with pytest.raises(UserError, match="absolute"):
        runner.start(names(), ["true"], log_path="x.log")
    with pytest.raises(UserError, match="environment"):
        runner.start(names(), ["true"], env={"A-B": "1"})
    with pytest.raises(UserError, match="empty"):
        runner.start(names(), "  ")
    assert runner.store.tmux_session_runs() == []


def test_missing_cwd_is_an_exit_status_with_the_reason_in_the_log(runner, names, tmp_path):
    name = names()
    rec = runner.start(name, ["true"], cwd=str(tmp_path / "nope"))
    wait_for(lambda: runner.status(name).state == "exited", what="exit")
    assert runner.status(name).exit_code == 1
    assert "nope" in Path(rec.log_path).read_text()


def test_stage_and_smoke_are_recorded(runner, names):
    name = names()
    runner.start(name, "exit 0", run_key="regen", smoke=True)
    runner.start(names(), "exit 0", run_key="regen")
    assert runner.store.latest_run("regen", smoke=True).tmux_session == name
    assert [r.attempt for r in runner.store.runs_for_stage("regen")] == [1, 2]


# -- looking ------------------------------------------------------------------------


def test_list_is_one_round_trip_and_ignores_foreign_sessions(make_runner, names, tmp_path):
    sent: list[str] = []
    runner = make_runner(LocalHost(audit=lambda host, cmd: sent.append(cmd)))
    live = [names() for _ in range(3)]
    for n in live:
        runner.start(n, ["sleep", "60"])
    foreign = f"user-{uuid.uuid4().hex[:10]}"
    subprocess.run([*TMUX, "new-session", "-d", "-s", foreign, "sleep", "60"], check=True)
    try:
        sent.clear()
        statuses = runner.list()
        assert len(sent) == 1
        assert sorted(s.tmux_session for s in statuses) == sorted(live)
        assert all(s.running for s in statuses)
        sent.clear()
        runner.reconcile()
        assert len(sent) == 1
        for n in live:
            runner.stop(n, grace=2)
        assert tmux_has(foreign)
    finally:
        subprocess.run([*TMUX, "kill-session", "-t", f"={foreign}"], capture_output=True)


def test_status_of_unknown_session_is_missing(runner, names):
    st = runner.status(names())
    assert st.state == "missing" and st.pid is None
    with pytest.raises(UserError, match="no session"):
        runner.stop(names())


def test_tail_and_follow(runner, names):
    name = names()
    assert runner.tail(name) == ""
    runner.start(name, "for i in 1 2 3 4 5; do echo line $i; sleep 0.05; done; printf 'caf\\xc3\\xa9\\n'")
    text = "".join(runner.follow(name, lines=None, poll=0.05))
    assert text == "line 1\nline 2\nline 3\nline 4\nline 5\ncafé\n"
    assert "".join(runner.follow(name, lines=2)) == "line 5\ncafé\n"
    assert "".join(runner.follow(name)) == ""
    assert runner.tail(name, lines=2) == "line 5\ncafé\n"
    assert runner.log_path(name).endswith(f"/{name}.log")


def test_run_being_started_by_another_process_is_starting_not_lost(runner, names):
    name = names()
    # Another nodedeck process recorded the launch and has not yet seen the job alive.
    rec = runner.store.insert_run(tmux_session=name, command="sleep 60", log_path="/tmp/x.log", exit_path="/tmp/x.exit")
    st = runner.status(name)
    assert (st.state, st.running) == ("starting", False)
    assert runner.store.get_run(rec.id).state == "starting"
    runner.store.update_run(rec.id, started_at=rec.started_at - 3600)  # that process died an hour ago
    assert runner.status(name).state == "lost"
    assert runner.store.get_run(rec.id).state == "lost"
    assert runner.store.events()[-1].kind == "run.lost"


def test_node_side_stop_rechecks_identity_before_signalling(tmp_path):
    """The last guard runs on the node, right before kill: a wrong start time or group signals nothing."""
    from ops.tmux.scripts import RunFiles, stop_script

    host = LocalHost()
    files = RunFiles(str(tmp_path), "guard")
    job = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        start = proc_start(job.pid)
        for bad_start, bad_group in ((start + 1, job.pid), (start, job.pid + 1)):
            out = host.run_script(stop_script(files, job.pid, bad_start, bad_group, grace=1)).check().text
            assert out.split() == ["gone"]
            assert job.poll() is None
        out = host.run_script(stop_script(files, job.pid, start, job.pid, grace=5)).check().text.split()
        assert out[:2] == ["terminated", "143"]
        assert job.wait(5) == -signal.SIGTERM
    finally:
        job.kill()
        job.wait()


@pytest.fixture
def flaky_tmux(tmp_path, monkeypatch):
    """tmux on PATH whose first `fails` new-sessions print `message` and exit 1, as tmux does when the server it
    reached was exiting (its last session had just been killed); every other call is the real tmux."""
    real, bindir = shutil.which("tmux"), tmp_path / "fakebin"
    bindir.mkdir()
    count = tmp_path / "new-session-calls"
    (bindir / "tmux").write_text(
        "#!/bin/bash\n"
        'case " $* " in *" new-session "*)\n'
        f'  echo x >> {shlex.quote(str(count))}\n'
        f'  if [ "$(wc -l < {shlex.quote(str(count))})" -le "$ND_FAILS" ]; then echo "$ND_MESSAGE" >&2; exit 1; fi;;\n'
        "esac\n"
        f'exec {shlex.quote(real)} "$@"\n')
    (bindir / "tmux").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")

    def arm(fails: int, message: str = "server exited unexpectedly"):
        monkeypatch.setenv("ND_FAILS", str(fails))
        monkeypatch.setenv("ND_MESSAGE", message)
        return lambda: len(count.read_text().splitlines()) if count.exists() else 0

    return arm


def test_a_start_that_meets_the_tmux_server_exiting_tries_again(runner, names, flaky_tmux):
    calls = flaky_tmux(2)
    rec = runner.start(names(), ["sleep", "60"])
    assert rec.state == "running" and alive(rec.pid) and calls() == 3


def test_a_tmux_server_that_keeps_exiting_is_one_clear_error_in_bounded_time(runner, names, flaky_tmux):
    calls = flaky_tmux(10_000)
    name, t0 = names(), time.monotonic()
    with pytest.raises(HostError, match=f"could not start session {name} on local: server exited unexpectedly$"):
        runner.start(name, ["sleep", "60"])
    assert time.monotonic() - t0 < 10 and 2 < calls() < 100
    assert [(r.tmux_session, r.state) for r in runner.store.tmux_session_runs()] == [(name, "failed")]
    assert not tmux_has(tmux_name(name))


def test_other_tmux_errors_are_not_tried_again(runner, names, flaky_tmux):
    calls = flaky_tmux(1, "create window failed: fork failed: Resource temporarily unavailable")
    with pytest.raises(HostError, match="fork failed"):
        runner.start(names(), ["sleep", "60"])
    assert calls() == 1


def test_what_tmux_says_when_it_fails_is_one_inert_line_of_at_most_300_characters(runner, names, flaky_tmux):
    flaky_tmux(1, "fork failed \x1b[2J" + "y" * 100_000)
    with pytest.raises(HostError) as e:
        runner.start(names(), ["sleep", "60"])
    said = str(e.value).split(": ", 1)[1]
    assert said.startswith("fork failed \\x1b[2Jyyy") and said.endswith("...") and len(said) == 300


def test_a_runner_of_another_workspace_reads_each_run_where_it_wrote_its_files(host, tmp_path, names):
    """Two workspaces on one node share its state file (it is per node): one's look at the other's
    finished run, whose session was removed, reads that run's exit file, never calls it lost."""
    store = StateStore(tmp_path / "state" / "node.sqlite")
    mine = TmuxRunner(host, store, str(tmp_path / "ws one" / "runs"))
    other = TmuxRunner(host, store, str(tmp_path / "ws two" / "runs"))
    done, stopped = names(), names()
    go = tmp_path / "go"
    rec = mine.start(done, f"while [ ! -e {go} ]; do sleep 0.02; done; exit 5")
    live = mine.start(stopped, ["sleep", "60"])
    go.touch()
    wait_for(lambda: os.path.exists(rec.exit_path), what="the job to finish")
    wait_for(lambda: not alive(rec.pid), what="its wrapper to end")
    mine.clean(done)   # a verified job's dead session is removed
    assert not tmux_has(tmux_name(done))

    statuses = {s.tmux_session: s for s in other.reconcile()}
    assert (statuses[done].state, statuses[done].exit_code) == ("exited", 5)
    assert (store.get_run(rec.id).state, store.get_run(rec.id).exit_code) == ("exited", 5)
    assert other.status(done).state == {s.tmux_session: s for s in other.list()}[done].state == "exited"

    result = other.stop(stopped, grace=5)
    assert result.outcome == "terminated" and os.path.exists(live.exit_path)
    assert not (tmp_path / "ws two" / "runs" / f"{stopped}.exit").exists()
    assert mine.status(stopped).state == "exited" and mine.status(stopped).exit_code == result.exit_code
    store.close()

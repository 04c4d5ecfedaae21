"""State file faults (issue 12 item 4): one line naming the file and the fix, nothing recorded lost,
`plan run` supervising on through a full disk or a read-only file, and a restore in one command.

Real SQLite files, a real tmpfs that fills up (skipped where it cannot be mounted), chattr +i where the
file system has it, real `nodedeck` processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from ops.paths import state_dir
from ops.state import StateFileError, StateStore, StateWriteError
from tests.support.tmux_sessions import kill_plan_sessions

ROOT = Path(__file__).resolve().parent.parent


def nd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def one_line(err: str) -> str:
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def filled(path: Path) -> StateStore:
    store = StateStore(path)
    for i in range(300):
        store.add_event("note", f"event {i} " + "x" * 100)
    run = store.insert_run(tmux_session="s", command="true", log_path="/l", exit_path="/e", run_key="p/a")
    store.update_run(run.id, state="exited", exit_code=0)
    store.set_stage_state("a", "completed", detail="exit 0; 1 checks pass", plan="p")
    return store


def test_an_empty_state_file_is_refused_not_taken_as_new_and_restored_in_one_command(tmp_path):
    path = tmp_path / "node.sqlite"
    store = filled(path)
    store.backup()
    store.close()
    path.write_bytes(b"")
    with pytest.raises(StateFileError, match=r"empty \(0 bytes\).*nodedeck state restore --file"):
        StateStore(path)
    assert path.stat().st_size == 0   # refused, not overwritten with a new empty state

    res = nd("state", "restore", "--file", str(path), "--json")
    assert res.returncode == 0, res.stderr
    done = json.loads(res.stdout)
    assert done["source"] == str(path) + ".bak" and Path(done["kept"]).exists()
    store = StateStore(path)
    assert len(store.events(limit=1000)) == 300
    assert store.latest_run("p/a").exit_code == 0 and store.get_stage_states("p")["a"].state == "completed"
    store.close()


def test_a_new_state_file_is_never_left_empty_by_concurrent_openers(tmp_path):
    path = tmp_path / "new.sqlite"
    errors = []

    def open_one():
        try:
            StateStore(path).close()
        except Exception as e:   # noqa: BLE001 - every failure is the finding
            errors.append(e)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and path.stat().st_size > 0


def test_a_damaged_last_page_is_one_line_for_every_command_and_state_restore_fixes_it(tmp_path):
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{tmp_path / "work"}"\n')
    plan = tmp_path / "p.toml"
    plan.write_text('[plan]\nname = "p"\n[[stage]]\nid = "a"\ncommand = "true"\n')
    path = state_dir() / "nodes" / "local.sqlite"
    store = filled(path)
    store.backup()
    store.close()
    with open(path, "r+b") as f:   # the last page overwritten
        f.seek(-4096, os.SEEK_END)
        f.write(b"\xff" * 4096)

    for argv in (("plan", "show", str(plan)), ("plan", "run", str(plan), "--once"), ("tmux", "ls", "local")):
        res = nd("--config", str(cfg), *argv)
        assert res.returncode == 2
        line = one_line(res.stderr)
        assert str(path) in line and "damaged" in line and f"`nodedeck --config {cfg} state restore local`" in line

    res = nd("state", "check", "local", "--json")
    assert res.returncode == 1 and json.loads(res.stdout)["ok"] is False
    res = nd("state", "restore", "local")
    assert res.returncode == 0 and "restored" in res.stdout
    res = nd("--config", str(cfg), "plan", "show", str(plan), "--json")
    assert res.returncode == 0, res.stderr
    store = StateStore(path)
    assert len(store.events(limit=1000)) >= 300 and store.latest_run("p/a").exit_code == 0
    store.close()


def test_restore_refuses_to_replace_a_sound_file(tmp_path):
    path = tmp_path / "node.sqlite"
    filled(path).close()
    res = nd("state", "restore", "--file", str(path))
    assert res.returncode == 2 and "is sound" in one_line(res.stderr)


def _plan_run(tmp_path: Path, name: str, first: str) -> tuple[subprocess.Popen, Path, Path]:
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{work}"\n')
    plan = tmp_path / f"{name}.toml"
    plan.write_text(f'[plan]\nname = "{name}"\n'
                    f'[[stage]]\nid = "a"\ncommand = "{first}; echo ok > out/a"\noutputs = ["out/a"]\n'
                    f'[[stage]]\nid = "b"\ndepends_on = ["a"]\ncommand = "echo ok > out/b"\noutputs = ["out/b"]\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "--config", str(cfg), "plan", "run", str(plan),
                             "--poll", "0.1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, work, plan


def _read_until(proc: subprocess.Popen, lines: list[str], text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not any(text in ln for ln in lines):
        assert time.monotonic() < deadline and proc.poll() is None, f"no {text!r} in: {''.join(lines)}"
        line = proc.stdout.readline()
        if line:
            lines.append(line)


def _kill(proc: subprocess.Popen, name: str) -> None:
    proc.kill()
    proc.wait()
    kill_plan_sessions(name)


def _outcome(proc: subprocess.Popen, lines: list[str], name: str) -> None:
    rest, _ = proc.communicate(timeout=60)
    out = "".join(lines) + rest
    assert proc.returncode == 0 and "Traceback" not in out, out
    store = StateStore.for_node("local")
    try:
        assert {s: r.state for s, r in store.get_stage_states(name).items()} == {"a": "completed", "b": "completed"}
        runs = store.runs_for_stage(f"{name}/a")
        assert [(r.state, r.exit_code) for r in runs] == [("exited", 0)]
    finally:
        store.close()


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """XDG_STATE_HOME on a 3 MiB tmpfs of its own (root only)."""
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    monkeypatch.setenv("XDG_STATE_HOME", str(mnt))
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_plan_run_goes_on_through_a_full_disk_and_records_the_run_once_there_is_space(tmp_path, small_disk):
    name = f"full{uuid.uuid4().hex[:6]}"
    StateStore.for_node("local").close()
    proc, work, _ = _plan_run(tmp_path, name, "sleep 2")
    lines: list[str] = []
    try:
        _read_until(proc, lines, "a: launched", 30)
        with open(small_disk / "filler", "wb") as f:   # fill the disk while stage a runs
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        _read_until(proc, lines, "the disk is full", 30)
        line = next(ln for ln in lines if "the disk is full" in ln)
        assert "local.sqlite" in line and "free space on" in line
        time.sleep(1.0)
        assert proc.poll() is None, "".join(lines)   # still supervising
        (small_disk / "filler").unlink()
        _outcome(proc, lines, name)
    finally:
        _kill(proc, name)


def test_plan_run_goes_on_while_the_state_file_is_immutable(tmp_path):
    if shutil.which("chattr") is None:
        pytest.skip("no chattr here")
    path = state_dir() / "nodes" / "local.sqlite"
    StateStore.for_node("local").close()
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("this file system has no immutable flag")
    name = f"imm{uuid.uuid4().hex[:6]}"
    proc, _, _ = _plan_run(tmp_path, name, "true")
    lines: list[str] = []
    try:
        _read_until(proc, lines, "read-only", 30)
        line = next(ln for ln in lines if "read-only" in ln)
        assert str(path) in line and "chattr -i" in line
        time.sleep(1.0)
        assert proc.poll() is None and not any("launched" in ln for ln in lines), "".join(lines)
        subprocess.run(["chattr", "-i", str(path)], check=True)
        _outcome(proc, lines, name)
    finally:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
        _kill(proc, name)


def test_write_errors_are_typed_one_liners(tmp_path):
    path = tmp_path / "node.sqlite"
    store = filled(path)
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("no immutable flag here")
    try:
        reopened = StateStore(path)
        with pytest.raises(StateWriteError, match="read-only"):
            reopened.add_event("x", "y")
        assert len(reopened.events(limit=1000)) == 300
    finally:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    reopened.add_event("x", "after")   # the next try, once writable, writes
    assert reopened.events(limit=1)[0].message == "after"
    reopened.close()
    store.close()


def test_state_backup_check_and_their_json(tmp_path):
    path = tmp_path / "node.sqlite"
    filled(path).close()
    res = nd("state", "backup", "--file", str(path), "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["backup"] == str(path) + ".bak"
    res = nd("state", "check", "--file", str(path), "--json")
    found = json.loads(res.stdout)
    assert res.returncode == 0 and found["ok"] and found["backups"][0] == {"path": str(path) + ".bak", "problem": None}
    res = nd("state", "backup", "--file", str(tmp_path / "none.sqlite"))
    assert res.returncode == 2 and "no state file" in one_line(res.stderr) and not (tmp_path / "none.sqlite").exists()

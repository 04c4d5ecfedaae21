"""The setup lock's keeper on the node is not trusted: whatever it prints, `SetupLock.acquire` ends promptly once
the setup is stopped, tells who holds the lock a bounded number of times, and a reply of JSON nested too deep (or of
values of the wrong kind) is one line, never a RecursionError's traceback."""

from __future__ import annotations

import json
import threading
import time
from typing import Callable

import pytest

from ops.errors import HostError
from ops.hosts.base import HostProcess
from ops.setup.lock import Holder, SetupLock, _holder, _stopped


class _Keeper(HostProcess):
    """A hostile keeper: `line(n)` is its n-th stdout line, one every `every` seconds, for ever."""

    def __init__(self, line: Callable[[int], bytes], every: float = 0.003):
        super().__init__()
        self.line, self.every, self.n = line, every, 0
        self.closed = threading.Event()
        self.written: list[bytes] = []

    def _read_some(self, timeout: float) -> bytes | None:
        if self.closed.is_set():
            return b""
        time.sleep(min(self.every, timeout))
        self.n += 1
        return self.line(self.n)

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def stderr_tail(self) -> str:
        return ""

    def close(self) -> None:
        self.closed.set()


class _Host:
    def __init__(self, proc: HostProcess):
        self.proc = proc

    def open_process(self, argv, timeout=None):
        return self.proc


def _busy(n: int) -> bytes:
    return b"NDK BUSY " + json.dumps({"holder": "someone", "since": 1.7e9, "pid": 4242}).encode() + b"\n"


def _busy_changing(n: int) -> bytes:
    return b"NDK BUSY " + json.dumps({"holder": f"someone {n}", "since": 1.7e9 + n, "pid": n}).encode() + b"\n"


def _acquire(proc: HostProcess, cancelled: Callable[[], bool], limit: float = 10.0):
    """acquire() in a thread: (what it raised or returned, on_busy's calls, seconds it took); None for what it
    did when it still ran after `limit` seconds."""
    lock = SetupLock(_Host(proc), "python3", "/root/.nodedeck", "/root/.nodedeck/venv")  # type: ignore[arg-type]
    told: list[Holder] = []
    ended: list[object] = []

    def run() -> None:
        try:
            ended.append(lock.acquire("me", told.append, cancelled))
        except BaseException as e:  # noqa: BLE001 - the test looks at whatever it was
            ended.append(e)

    t0 = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    took = time.monotonic() - t0
    if t.is_alive():
        proc.close()                 # ends the loop of an unfixed acquire (it reads b"" then), not to leak it
        t.join(5)
        return None, told, took
    return ended[0], told, took


def test_acquire_ends_promptly_once_cancelled_while_busy_lines_keep_coming():
    proc = _Keeper(_busy)
    ended, told, took = _acquire(proc, lambda: True, limit=5.0)
    assert isinstance(ended, HostError), f"acquire still ran after {took:.1f}s (on_busy called {len(told)} times)"
    assert "stopped while waiting for the setup lock" in str(ended)
    assert took < 3.0
    assert proc.closed.is_set()


def test_acquire_cancelled_midway_while_the_same_holder_is_said_again_and_again():
    proc = _Keeper(_busy)
    t0 = time.monotonic()
    ended, told, took = _acquire(proc, lambda: time.monotonic() - t0 > 1.5, limit=6.0)
    assert isinstance(ended, HostError), f"acquire still ran after {took:.1f}s (on_busy called {len(told)} times)"
    assert took < 4.0
    assert proc.n > 100                                   # the keeper did say it many times
    assert told == [Holder("someone", 1.7e9, 4242)]       # told once: it never changed


def test_a_holder_that_changes_on_every_line_is_told_at_most_once_a_second():
    proc = _Keeper(_busy_changing)
    t0 = time.monotonic()
    ended, told, took = _acquire(proc, lambda: time.monotonic() - t0 > 2.5, limit=6.0)
    assert isinstance(ended, HostError), f"acquire still ran after {took:.1f}s (on_busy called {len(told)} times)"
    assert proc.n > 100
    assert 1 <= len(told) <= took + 1, f"on_busy called {len(told)} times in {took:.1f}s"


def test_a_busy_line_then_locked_returns_who_was_waited_for():
    lines = {1: _busy(1), 2: b"NDK LOCKED 99\n"}
    proc = _Keeper(lambda n: lines.get(n, b""), every=0.01)
    ended, told, _ = _acquire(proc, lambda: False)
    try:
        assert ended == Holder("someone", 1.7e9, 4242)
        assert told == [Holder("someone", 1.7e9, 4242)]
    finally:
        proc.close()


DEEP = "[" * 100_000 + "]" * 100_000


def test_a_busy_line_of_json_nested_too_deep_is_one_line_not_a_recursion_error():
    lines = {1: b"NDK BUSY " + DEEP.encode() + b"\n", 2: b"NDK LOCKED 99\n"}
    proc = _Keeper(lambda n: lines.get(n, b""), every=0.01)
    ended, told, _ = _acquire(proc, lambda: False)
    assert not isinstance(ended, BaseException), repr(ended)
    assert isinstance(ended, Holder) and told == [ended]
    assert "\n" not in ended.text and len(ended.text) < 300


def test_holder_of_json_nested_too_deep():
    h = _holder(DEEP)
    assert h.pid is None and h.since is None and len(h.holder) <= 200 and "\n" not in h.text


@pytest.mark.parametrize("said, holder, since, pid", [
    ({"holder": "a@b pid 1 (cli)", "since": 1.7e9, "pid": 77}, "a@b pid 1 (cli)", 1.7e9, 77),
    ({"holder": [[[[]]]] , "since": True, "pid": True}, "another setup", None, None),
    ({"holder": {"x": 1}, "since": float("1e300"), "pid": 10**40}, "another setup", None, None),
    ({"holder": "x\x1b[2Jy\nz", "since": -5, "pid": -1}, "x\\x1b[2Jy\\nz", None, None),
    ({"holder": "x" * 10_000, "since": "1700000000", "pid": "77"}, "x" * 197 + "...", None, None),
    ({"pid": 2**40}, "another setup", None, None),
])
def test_holder_values_are_checked_and_bounded(said, holder, since, pid):
    h = _holder(json.dumps(said))
    assert (h.holder, h.since, h.pid) == (holder, since, pid)
    assert "\n" not in h.text and "\x1b" not in h.text


def test_holder_nested_deep_but_parseable_is_not_printed_by_repr():
    h = _holder(json.dumps({"holder": "[" * 900 + "]" * 900}))     # a string: shown as it is, cut
    assert len(h.holder) == 200
    h = _holder('{"holder": ' + "[" * 200 + "]" * 200 + "}")       # not a string: never str() of it
    assert h.holder == "another setup"


def test_stopped_reply_of_json_nested_too_deep_is_one_line_error():
    with pytest.raises(HostError) as e:
        _stopped(DEEP)
    assert "\n" not in str(e.value) and len(str(e.value)) < 300


def test_stop_with_a_reply_nested_too_deep_raises_host_error_not_recursion_error():
    lines = {1: b"NDK LOCKED 99\n", 2: b"NDK STOPPED " + ("[" * 60_000).encode() + b"\n"}
    proc = _Keeper(lambda n: lines.get(n, b"") if n <= 2 else None, every=0.01)  # type: ignore[arg-type,return-value]
    lock = SetupLock(_Host(proc), "python3", "/root/.nodedeck", "/root/.nodedeck/venv")  # type: ignore[arg-type]
    assert lock.acquire("me", lambda h: None, lambda: False) is None
    try:
        with pytest.raises(HostError) as e:
            lock.stop()
        assert "\n" not in str(e.value) and len(str(e.value)) < 300
    finally:
        lock.release()


@pytest.mark.parametrize("said, expected", [
    ([{"pid": 12, "argv": "pip install x", "killed": True}], [(12, "pip install x", True)]),
    ([{"pid": True, "argv": "a"}, {"pid": 2**40, "argv": "b"}, {"pid": -3, "argv": "c"}, {"pid": "7"}], []),
    ([{"pid": 5, "argv": ["not", "text"]}], [(5, "", False)]),
    ([{"pid": 5, "argv": "x\x1b]0;t\x07" + "y" * 1000}], [(5, "x\\x1b]0;t\\x07" + "y" * 284 + "...", False)]),
])
def test_stopped_values_are_checked_and_bounded(said, expected):
    assert [(s.pid, s.argv, s.killed) for s in _stopped(json.dumps(said))] == expected


def test_stopped_list_is_bounded():
    found = _stopped(json.dumps([{"pid": i + 1, "argv": "x"} for i in range(5000)]))
    assert 0 < len(found) <= 100


def test_stopped_reply_that_is_no_list_is_one_line_error():
    for said in ("not json", '{"pid": 1}', "[" * 5000):
        with pytest.raises(HostError) as e:
            _stopped(said)
        assert "\n" not in str(e.value)

"""Incremental tails: log follow and training metrics JSONL, locally and over SSH."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from ops.errors import HostError
from ops.hosts.local import LocalHost
from ops.hosts.ssh import SSHHost
from ops.telemetry.history import History
from ops.telemetry.series import TrainingKey
from ops.telemetry.tail import FileTail, LogFollower
from ops.telemetry.training import TrainingMetrics


class CountingHost(LocalHost):
    """LocalHost that counts what read_range transfers."""

    def __init__(self):
        super().__init__()
        self.bytes_read = 0
        self.reads = 0

    def read_range(self, path, offset=0, length=None):
        data = super().read_range(path, offset, length)
        self.bytes_read += len(data)
        self.reads += 1
        return data


def append(path, text: str | bytes):
    with open(path, "ab") as f:
        f.write(text.encode() if isinstance(text, str) else text)


# -- FileTail -----------------------------------------------------------------------
def test_only_complete_lines_and_partial_line_waits(tmp_path):
    p = tmp_path / "a.log"
    p.write_text("one\ntw")
    t = FileTail(LocalHost(), str(p))
    assert t.poll() == (["one"], False)
    assert t.poll() == ([], False)
    append(p, "o\nthree\r\nfour")
    assert t.poll() == (["two", "three"], False)
    append(p, "\n")
    assert t.poll() == (["four"], False)


def test_progress_bar_carriage_returns_keep_the_last_frame(tmp_path):
    p = tmp_path / "bar.log"
    p.write_text("10%|#   \r50%|#####  \r100%|########\nnext\n")
    assert FileTail(LocalHost(), str(p)).poll()[0] == ["100%|########", "next"]


def test_truncation_restarts_from_zero(tmp_path):
    p = tmp_path / "a.log"
    p.write_text("a\nb\nc\n")
    t = FileTail(LocalHost(), str(p))
    assert t.poll()[0] == ["a", "b", "c"]
    p.write_text("x\n")  # truncated and rewritten, smaller than the offset
    assert t.poll() == (["x"], True)


def test_rotation_restarts_even_when_the_new_file_is_bigger(tmp_path):
    p = tmp_path / "a.log"
    p.write_text("first run line 1\n")
    t = FileTail(LocalHost(), str(p))
    t.poll()
    os.rename(p, tmp_path / "a.log.1")
    p.write_text("second run line 1\nsecond run line 2\n")
    assert t.poll() == (["second run line 1", "second run line 2"], True)


def test_rewritten_in_place_with_new_first_bytes_restarts(tmp_path):
    p = tmp_path / "a.log"
    p.write_text("AAAA\n")
    t = FileTail(LocalHost(), str(p))
    t.poll()
    with open(p, "r+b") as f:  # same inode, content replaced and grown
        f.write(b"BBBB\nCCCC\n")
    assert t.poll() == (["BBBB", "CCCC"], True)


def test_missing_file_and_directory_are_clear_errors(tmp_path):
    with pytest.raises(HostError, match="no such file"):
        FileTail(LocalHost(), str(tmp_path / "nope")).poll()
    with pytest.raises(HostError, match="is a directory"):
        FileTail(LocalHost(), str(tmp_path)).poll()


def test_poll_reads_at_most_max_bytes_per_call(tmp_path):
    p = tmp_path / "big.log"
    p.write_bytes(b"".join(b"line %05d\n" % i for i in range(10_000)))  # 110 kB
    t = FileTail(LocalHost(), str(p))
    got = []
    for _ in range(20):
        lines, _ = t.poll(max_bytes=16_384)
        got += lines
        if t.offset == t.size:
            break
    assert got == [f"line {i:05d}" for i in range(10_000)]


# -- LogFollower ------------------------------------------------------------------------
def test_last_n_lines_read_backwards_without_reading_the_whole_file(tmp_path):
    p = tmp_path / "server.log"
    line = b"x" * 90 + b"\n"
    with open(p, "wb") as f:
        for i in range(200):  # ~18 MB
            f.write(line * 999 + b"block %d\n" % i)
    size = p.stat().st_size
    host = CountingHost()
    f = LogFollower(host, str(p), n=3, maxlen=10)
    snap = f.poll()
    assert snap.lines == ["x" * 90, "x" * 90, "block 199"]
    assert host.bytes_read < 200_000 < size  # one block from the end (+ the first bytes)
    append(p, "new 1\nnew 2\n")
    before = host.bytes_read
    snap = f.poll()
    assert snap.new_lines == ["new 1", "new 2"]
    assert snap.lines[-3:] == ["block 199", "new 1", "new 2"]
    assert host.bytes_read - before < 200  # only the new bytes (and the fingerprint)
    reads = host.reads
    assert f.poll().new_lines == [] and host.reads == reads  # nothing new: stat only


def test_follow_buffer_is_bounded(tmp_path):
    p = tmp_path / "s.log"
    p.write_text("".join(f"{i}\n" for i in range(50)))
    f = LogFollower(LocalHost(), str(p), n=5, maxlen=8)
    assert f.poll().lines == ["45", "46", "47", "48", "49"]
    append(p, "".join(f"{i}\n" for i in range(50, 60)))
    assert f.poll().lines == [str(i) for i in range(52, 60)]


def test_last_lines_of_short_files_and_files_without_newline(tmp_path):
    p = tmp_path / "s.log"
    p.write_text("only\npartial")
    f = LogFollower(LocalHost(), str(p), n=10)
    assert f.poll().lines == ["only"]
    append(p, " line\n")
    assert f.poll().new_lines == ["partial line"]
    e = tmp_path / "empty.log"
    e.write_text("")
    g = LogFollower(LocalHost(), str(e), n=10)
    assert g.poll().lines == []
    append(e, "hello\n")
    assert g.poll().new_lines == ["hello"]


def test_huge_line_scan_is_bounded(tmp_path):
    p = tmp_path / "noline.bin"
    with open(p, "wb") as f:
        f.truncate(200 << 20)  # 200 MB sparse, no newline at all
    host = CountingHost()
    t = FileTail(host, str(p))
    assert t.seek_tail(10, max_scan=1 << 20) == []
    assert host.bytes_read <= (1 << 20) + 64 * 1024 + 64


def test_follow_after_rotation_shows_the_new_file(tmp_path):
    p = tmp_path / "s.log"
    p.write_text("old 1\nold 2\n")
    f = LogFollower(LocalHost(), str(p), n=5)
    f.poll()
    os.rename(p, tmp_path / "s.log.1")
    p.write_text("new 1\n")
    snap = f.poll()
    assert snap.restarted and snap.new_lines == ["new 1"]


# -- training metrics JSONL -------------------------------------------------------------------
def rec(step, **kw):
    return json.dumps({"step": step, "loss": 10.0 / step, "lr": 1e-4, "acc_0": 0.1 * (step % 10), **kw}) + "\n"


def test_training_metrics_incremental_with_malformed_lines(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(rec(1) + "not json\n" + rec(2) + '["a list"]\n' + '{"loss": 1.0}\n' + rec(3)[:-10])
    h = History()
    tm = TrainingMetrics(LocalHost(), str(p), history=h, total_steps=100)
    snap = tm.poll()
    assert snap.step == 2 and snap.loss == 5.0 and snap.lr == 1e-4
    assert snap.records == 2 and snap.skipped_lines == 3  # the partial record waits
    with open(p, "a") as f:
        f.write(rec(3)[-10:] + "{broken\n" + rec(4))
    snap = tm.poll()
    assert snap.step == 4 and snap.records == 4 and snap.skipped_lines == 4
    xs, ys = h.get(TrainingKey(str(p), "loss"))
    assert xs.tolist() == [1, 2, 3, 4] and ys.tolist() == [10.0, 5.0, 10 / 3, 2.5]
    assert h.keys() == [TrainingKey(str(p), f) for f in ("loss", "lr", "acc_0")]
    assert snap.latest["acc_0"] == pytest.approx(0.4)


def test_training_rate_and_eta_from_record_timestamps(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text("".join(rec(s, ts=1000.0 + s * 0.5, total_steps=1000) for s in range(1, 101)))
    snap = TrainingMetrics(LocalHost(), str(p)).poll()
    assert snap.steps_per_s == pytest.approx(2.0)
    assert snap.total_steps == 1000
    assert snap.eta_s == pytest.approx(900 / 2.0)


def test_total_steps_and_timestamps_are_not_chart_series(tmp_path):
    """What the trainer writes beside the metrics (`total_steps`, `ts`) feeds the ETA, not the charts."""
    p = tmp_path / "m.jsonl"
    p.write_text("".join(rec(s, ts=1000.0 + s, total_steps=50) for s in range(1, 6)))
    h = History(capacity=100)
    TrainingMetrics(LocalHost(), str(p), history=h).poll()
    assert {k.field for k in h.keys()} == {"loss", "lr", "acc_0"}    # no total_steps, no ts


def test_training_rate_without_timestamps_uses_poll_times(tmp_path, monkeypatch):
    import ops.telemetry.training as tr

    clock = iter([100.0, 110.0, 130.0])
    monkeypatch.setattr(tr, "time", SimpleNamespace(time=lambda: next(clock)))  # this module's clock only
    p = tmp_path / "m.jsonl"
    p.write_text("".join(rec(s) for s in range(1, 51)))
    tm = TrainingMetrics(LocalHost(), str(p), total_steps=250)
    assert tm.poll().steps_per_s is None  # one observation so far
    append(p, "".join(rec(s) for s in range(51, 71)))
    snap = tm.poll()
    assert snap.steps_per_s == pytest.approx(20 / 10)  # not fooled by the 50 backlog records
    assert snap.eta_s == pytest.approx(180 / 2.0)
    append(p, "".join(rec(s) for s in range(71, 111)))
    assert tm.poll().steps_per_s == pytest.approx(60 / 30)


def test_training_restart_on_truncation_clears_history(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text("".join(rec(s) for s in range(1, 30)))
    h = History()
    tm = TrainingMetrics(LocalHost(), str(p), history=h)
    tm.poll()
    p.write_text(rec(1) + "oops\n")
    snap = tm.poll()
    assert snap.step == 1 and snap.records == 1 and snap.skipped_lines == 1
    assert h.get(TrainingKey(str(p), "loss"))[0].tolist() == [1]


# -- over SSH ---------------------------------------------------------------------------
def test_remote_follow_and_training_over_ssh(sshd, tmp_path):
    host = SSHHost("testnode", "testnode", ssh_config=sshd.ssh_config)
    try:
        log = sshd.root / "remote.log"
        log.write_text("".join(f"l{i}\n" for i in range(1000)))
        f = LogFollower(host, str(log), n=4)
        assert f.poll().lines == ["l996", "l997", "l998", "l999"]
        append(log, "l1000\npart")
        assert f.poll().new_lines == ["l1000"]
        append(log, "ial\n")
        assert f.poll().new_lines == ["partial"]
        log.write_text("rotated\n")
        snap = f.poll()
        assert snap.restarted and snap.new_lines == ["rotated"]

        m = sshd.root / "metrics.jsonl"
        m.write_text(rec(1) + "garbage\n" + rec(2))
        tm = TrainingMetrics(host, str(m))
        snap = tm.poll()
        assert (snap.step, snap.records, snap.skipped_lines) == (2, 2, 1)
        append(m, rec(3))
        assert tm.poll().step == 3
        with pytest.raises(HostError, match="no such file"):
            FileTail(host, str(sshd.root / "absent.log")).poll()
    finally:
        host.close()

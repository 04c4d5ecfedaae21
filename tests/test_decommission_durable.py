"""Flusher: each landed file is fsynced in a thread as it lands, its directory at close; never through a link."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from ops.decommission import durable
from ops.decommission.durable import Flusher
from ops.decommission.inputs import Options
from ops.decommission.localtree import DestTree
from ops.decommission.wizard import Decommission
from ops.hosts.local import LocalHost


def _land(tree: DestTree, path: str, data: bytes) -> None:
    with tree.directory(path.rpartition("/")[0]):
        pass
    with tree.open_part(path, append=False) as f:
        f.write(data)
    tree.finalize(path, 0o644, 1_600_000_000 * 10**9)


@pytest.fixture
def synced(monkeypatch):
    """What os.fsync was called on, as real paths (the descriptor's target), in order."""
    seen: list[str] = []
    one = threading.Event()
    real = os.fsync

    def fsync(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        one.set()
        real(fd)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    return seen, one


def test_a_landed_file_is_synced_before_close_and_its_directory_at_close(tmp_path, synced):
    seen, one = synced
    tree = DestTree(tmp_path / "dest")
    flusher = Flusher(tree)
    _land(tree, "a/b.bin", b"b")
    flusher.put("a/b.bin")
    assert one.wait(5), "the file is synced while the others still come, not only at close"
    assert seen == [str(tmp_path / "dest/files/a/b.bin")]
    _land(tree, "a/c.bin", b"c")
    flusher.put("a/c.bin")
    assert flusher.close() == {}
    assert seen[1:] == [str(tmp_path / "dest/files/a/c.bin"), str(tmp_path / "dest/files/a")]
    tree.close()


def test_a_file_swapped_for_a_link_is_not_followed_and_is_reported(tmp_path, synced):
    seen, _ = synced
    outside = tmp_path / "victim.bin"
    outside.write_bytes(b"precious")
    tree = DestTree(tmp_path / "dest")
    _land(tree, "x.bin", b"x")
    (tmp_path / "dest/files/x.bin").unlink()
    os.symlink(outside, tmp_path / "dest/files/x.bin")
    flusher = Flusher(tree)
    flusher.put("x.bin")
    errors = flusher.close()
    assert list(errors) == ["x.bin"] and "symbolic links" in errors["x.bin"]
    assert str(outside) not in seen
    tree.close()


def test_a_file_that_cannot_be_synced_is_not_claimed_safe(tmp_path, monkeypatch):
    root = tmp_path / "node"
    root.mkdir()
    (root / "good.txt").write_text("good\n")
    (root / "bad.txt").write_text("bad\n")
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("bad.txt"):
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    d = Decommission(LocalHost(), "local", str(root), Options(tmp_path / "dest"))
    d.run()
    assert not d.verdict.safe
    reasons = {m.path: m.reason for m in d.verdict.missing}
    assert reasons == {"bad.txt": "not durable on the local disk (fsync: Input/output error)"}
    assert d.files["good.txt"].verified
    assert Path(tmp_path / "dest/files/bad.txt").read_text() == "bad\n"

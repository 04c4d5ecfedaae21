"""PartWriter: page-aligned chunks reach the disk with O_DIRECT, the rest through the page cache; same bytes."""

from __future__ import annotations

import errno
import fcntl
import os

import pytest

from ops.decommission import direct, localtree
from ops.decommission.direct import ALIGN, PartWriter, aligned_buffer
from ops.decommission.localtree import DestTree, part_name


def _o_direct_works(where) -> bool:
    try:
        fd = os.open(where / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
    except OSError:
        return False
    os.close(fd)
    os.unlink(where / "probe")
    return True


@pytest.fixture
def writes(monkeypatch):
    """(O_DIRECT on?, length) of every write(2) the writer makes."""
    seen: list[tuple[bool, int]] = []
    real = os.write

    def write(fd: int, data) -> int:
        seen.append((bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT), len(data)))
        return real(fd, data)

    monkeypatch.setattr(direct.os, "write", write)
    return seen


def _chunks(data: bytes, size: int):
    """data in chunks of `size` from one reused page-aligned buffer, as OpenSSHStream hands them out."""
    buf = aligned_buffer(size)
    view = memoryview(buf)
    for i in range(0, len(data), size):
        n = len(data[i:i + size])
        view[:n] = data[i:i + n]
        yield view[:n]


def _part(tree: DestTree, path: str) -> bytes:
    with open(part_name(path), "rb", opener=lambda p, fl: os.open(p, fl, dir_fd=tree.partial_fd)) as f:
        return f.read()


def test_aligned_chunks_go_direct_and_the_tail_through_the_page_cache(tmp_path, writes):
    if not _o_direct_works(tmp_path):
        pytest.skip("this filesystem refuses O_DIRECT")
    tree = DestTree(tmp_path / "dest")
    data = os.urandom(2 * (1 << 20) + 5000)
    with tree.open_part("a.bin", append=False, direct=True) as f:
        out = PartWriter(f)
        for chunk in _chunks(data, 1 << 20):
            out.write(chunk, aligned=True)
    assert writes == [(True, 1 << 20), (True, 1 << 20), (True, ALIGN), (False, 5000 - ALIGN)]
    assert _part(tree, "a.bin") == data
    tree.close()


def test_a_resume_from_an_odd_size_and_unaligned_memory_are_written_buffered(tmp_path, writes):
    tree = DestTree(tmp_path / "dest")
    head, rest = os.urandom(1000), os.urandom(3 * ALIGN)
    with tree.open_part("b.bin", append=False) as f:
        f.write(head)
    with tree.open_part("b.bin", append=True, direct=True) as f:
        out = PartWriter(f)
        for chunk in _chunks(rest, 2 * ALIGN):
            out.write(chunk, aligned=True)
    with tree.open_part("c.bin", append=False, direct=True) as f:
        PartWriter(f).write(rest, aligned=False)
    assert not any(on for on, _ in writes)
    assert _part(tree, "b.bin") == head + rest and _part(tree, "c.bin") == rest
    tree.close()


def test_a_filesystem_refusing_o_direct_gets_buffered_writes(tmp_path, writes, monkeypatch):
    real = os.open

    def refuse(path, flags, *a, **k):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, *a, **k)

    monkeypatch.setattr(localtree.os, "open", refuse)
    tree = DestTree(tmp_path / "dest")
    data = os.urandom(2 * ALIGN)
    with tree.open_part("d.bin", append=False, direct=True) as f:
        PartWriter(f).write(next(_chunks(data, len(data))), aligned=True)
    assert writes == [(False, len(data))]
    assert _part(tree, "d.bin") == data
    tree.close()


def test_a_direct_write_refused_midway_goes_on_buffered(tmp_path, monkeypatch):
    if not _o_direct_works(tmp_path):
        pytest.skip("this filesystem refuses O_DIRECT")
    real = os.write
    refused = []

    def write(fd: int, data) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT and not refused:
            refused.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data)

    monkeypatch.setattr(direct.os, "write", write)
    tree = DestTree(tmp_path / "dest")
    data = os.urandom(4 * ALIGN)
    with tree.open_part("e.bin", append=False, direct=True) as f:
        out = PartWriter(f)
        for chunk in _chunks(data, 2 * ALIGN):
            out.write(chunk, aligned=True)
    assert refused == [2 * ALIGN]
    assert _part(tree, "e.bin") == data
    tree.close()

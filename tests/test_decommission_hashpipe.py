"""HashPipe: finished downloads reach the node's hasher in batches (full, idle, or at close)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ops.decommission import checksums
from ops.decommission.checksums import HashPipe


@dataclass
class Job:
    name: str
    size: int


def test_a_batch_goes_when_nothing_new_comes_then_the_rest_at_close():
    batches: list[list[str]] = []
    sent = threading.Event()

    def hash_batch(jobs: list[Job]) -> None:
        batches.append([j.name for j in jobs])
        sent.set()

    pipe = HashPipe(hash_batch)
    pipe.put(Job("a", 1))
    pipe.put(Job("b", 2))
    assert sent.wait(5), "an idle pipe sends what it holds"
    pipe.put(Job("c", 3))
    pipe.close()
    assert batches == [["a", "b"], ["c"]]


def test_a_full_batch_goes_at_once(monkeypatch):
    monkeypatch.setattr(checksums, "BATCH_FILES", 2)
    monkeypatch.setattr(HashPipe, "IDLE", 60.0)   # only fullness (or close) can send a batch here
    batches: list[list[str]] = []
    two = threading.Event()

    def hash_batch(jobs: list[Job]) -> None:
        batches.append([j.name for j in jobs])
        if len(batches) == 2:
            two.set()

    pipe = HashPipe(hash_batch)
    for name in "abcd":
        pipe.put(Job(name, 1))
    assert two.wait(5)
    pipe.put(Job("e", 1))
    pipe.close()
    assert batches == [["a", "b"], ["c", "d"], ["e"]]


def test_close_with_nothing_queued_hashes_nothing():
    batches: list[list[Job]] = []
    pipe = HashPipe(batches.append)
    pipe.close()
    assert batches == []

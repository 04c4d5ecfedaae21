"""Checksums computed on the node: `sha256sum`/`md5sum -z` over `xargs -0`, in batches, NUL-safe."""

from __future__ import annotations

import queue
import re
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Callable, Generic, Iterable, Protocol, TypeVar

from ops.errors import HostError
from ops.hosts.base import Host
from ops.textsafe import printable

BATCH_FILES = 512
BATCH_BYTES = 8 << 30
ERR_BYTES_PER_FILE = 8192
"""The most of a hashing tool's stderr read per file of its batch: a line naming a path (at most PATH_MAX bytes)."""
HASH_RATE_FLOOR = 40 << 20  # bytes/s assumed for the slowest disk when sizing timeouts


def _batches(items: list[tuple[str, int]]) -> Iterable[list[tuple[str, int]]]:
    batch: list[tuple[str, int]] = []
    size = 0
    for path, n in items:
        if batch and (len(batch) >= BATCH_FILES or size + n > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append((path, n))
        size += n
    if batch:
        yield batch


def _hash_batch(host: Host, tool: str, batch: list[tuple[str, int]]) -> dict[str, str | Exception]:
    paths = [p for p, _ in batch]
    timeout = 120 + sum(n for _, n in batch) / HASH_RATE_FLOOR
    try:
        res = host.run(["xargs", "-0", "-r", tool, "-z", "--"],
                       input=b"\0".join(p.encode("utf-8", "surrogateescape") for p in paths) + b"\0", timeout=timeout)
    except HostError as e:
        return {p: e for p in paths}
    digest = re.compile(rb"[0-9a-f]{%d}" % (64 if tool == "sha256sum" else 32))
    out: dict[str, str | Exception] = {}
    for rec in res.stdout.split(b"\0"):
        if (m := digest.match(rec)) and rec[m.end() : m.end() + 1] == b" " and len(rec) > m.end() + 2:
            out[rec[m.end() + 2 :].decode("utf-8", "surrogateescape")] = m[0].decode()
    # one line per file it could not read is expected: what is read of the rest stays bounded in time and memory
    said = res.stderr[: ERR_BYTES_PER_FILE * len(paths)].decode(errors="replace").splitlines()[: 2 * len(paths) + 8]
    errors = [line for line in said if line.strip()]
    for p in paths:
        if p not in out:
            why = next((line for line in errors if p in line), errors[0] if errors else f"{tool} gave no digest")
            out[p] = HostError(printable(why))
    return out


def node_digests(
    host: Host,
    items: list[tuple[str, int]],
    *,
    tool: str = "sha256sum",
    workers: int = 2,
    on_batch: Callable[[int, int], None] | None = None,
) -> dict[str, str | Exception]:
    """Hash (node path, size) items on the node: node path -> hex digest, or the error.

    `on_batch(files, bytes)` is called as each batch completes.
    """
    out: dict[str, str | Exception] = {}
    batches = list(_batches(items))
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(batches) or 1))) as pool:
        futures = {pool.submit(_hash_batch, host, tool, b): b for b in batches}
        for fut in as_completed(futures):
            out.update(fut.result())
            if on_batch is not None:
                batch = futures[fut]
                on_batch(len(batch), sum(n for _, n in batch))
    return out



class _Sized(Protocol):
    size: int


J = TypeVar("J", bound=_Sized)


class HashPipe(Generic[J]):
    """Feeds finished downloads to `hash_batch` in a thread, so the node hashes while others still come.

    A batch goes when it is full (BATCH_FILES / BATCH_BYTES) or nothing new came for IDLE seconds.
    """

    IDLE = 0.3

    def __init__(self, hash_batch: Callable[[list[J]], object]):
        self._hash_batch = hash_batch
        self._queue: queue.SimpleQueue[J | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def put(self, job: J) -> None:
        """Queue one job (its .size counts towards the batch)."""
        self._queue.put(job)

    def close(self) -> None:
        """Hash what is queued, then stop."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        batch: list[J] = []
        size = 0
        while True:
            try:
                job = self._queue.get(timeout=self.IDLE if batch else None)
            except queue.Empty:  # idle (the wait has a timeout only with a batch): send what there is
                self._hash_batch(batch)
                batch, size = [], 0
                continue
            if job is not None:
                batch.append(job)
                size += job.size
            if batch and (job is None or len(batch) >= BATCH_FILES or size >= BATCH_BYTES):
                self._hash_batch(batch)
                batch, size = [], 0
            if job is None:
                return
